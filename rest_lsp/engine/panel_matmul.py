"""The CPU matmul of a decoding step's few rows: fp32 weights in panels, streamed once, with the rows' arithmetic
hidden under the stream.

A step of a small model on a CPU is a pass over every weight for a handful of rows (1 for plain decoding, 8-16 for
a draft tree). Memory decides its price: SmolLM2-135M's layers are 405 MB of fp32, which two cores of the reference
machine read in 22.8 ms. oneDNN's packed kernel takes 37.9 ms for one row and 53.4 ms for twelve: it reads the
weights and then does the rows' arithmetic, one after the other (benchmarks/bench_linear.py). No library we can
depend on has a kernel for this shape (llama.cpp's are for its quantized formats), so this one is ours, and small:

  - the weight [N, K] is stored once as panels [N/16, K, 16]: 16 output columns, all of K, contiguous;
  - a tile of up to 6 input rows keeps 6 x 16 sums in registers while it walks a panel, one fused multiply-add
    per weight and row; the rows of a tree are 1-3 tiles, so the panel is read from memory once;
  - while a panel is being multiplied, the next one is prefetched, so the memory is always busy;
  - the panels are split between torch.get_num_threads() threads of torch's own OpenMP pool: the library asks for
    libgomp.so.1, which a Linux torch wheel has loaded under that name already (one team of threads per process,
    see docs/how-it-works.md; a torch on another OpenMP runtime would get a second pool).

Each output is one chain of fused multiply-adds over k in order, whatever the number of rows: a row's result is
bit for bit the same alone or in a tree of 16 (a step's matmuls do not round differently with its width). The
order differs from MKL's and oneDNN's, as theirs differ from each other: fp32 rounding, no more.

The kernel is C, compiled here on first use with the system's C compiler (`CC`, else cc or gcc) for this CPU, kept
in the cache folder with the sha256 of its bytes, loaded only from a folder no other user may write and only when
those bytes match, and checked against F.linear before use; with no compiler, one that fails or a library that
disagrees, `available()` is False and the step runs on oneDNN (where torch has it).
The op is `torch.ops.rest_lsp.panel_mm`, so the TorchScript layer stack calls it like any other.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

PANEL = 16  # output columns per panel: two 8-float vectors (one AVX2 register each)

SOURCE = r"""
#include <stddef.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef long long idx; /* 64 bits everywhere (a head is 49152 x 576 x rows) */

#define NB 16 /* columns per panel */
#define MT 6  /* rows per tile: 6 x 2 vectors of sums, with the 2 weight vectors and a broadcast, fill 16 registers */

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 r; memcpy(&r, p, sizeof r); return r; }

/* rows x[0..R) (stride ldx) times one panel p [k][NB]; out [R][NB] gets the sums. `next`: the panel that comes
   after this one, of which this tile prefetches lines [first, first + k / tiles) (one 64-byte line per k), one
   every `tiles` steps: over the panel's tiles the whole next panel arrives, evenly, while this one is computed */
#define TILE(R)                                                                                              \
static void tile##R(const float *restrict x, idx ldx, const float *restrict p, idx k,                     \
                    const float *restrict next, idx first, idx tiles, float *restrict out) {              \
    v8 lo[R], hi[R];                                                                                         \
    for (int i = 0; i < R; i++) { lo[i] = (v8){0}; hi[i] = (v8){0}; }                                        \
    idx wait = tiles, line = first;                                                                         \
    for (idx j = 0; j < k; j++) {                                                                           \
        v8 w0 = load8(p + j * NB), w1 = load8(p + j * NB + 8);                                               \
        if (next && --wait == 0) { wait = tiles; __builtin_prefetch(next + line++ * NB, 0, 3); }             \
        _Pragma("GCC unroll 8")                                                                              \
        for (int i = 0; i < R; i++) {                                                                        \
            float s = x[i * ldx + j];                                                                        \
            v8 b = {s, s, s, s, s, s, s, s};                                                                 \
            lo[i] += b * w0;                                                                                 \
            hi[i] += b * w1;                                                                                 \
        }                                                                                                    \
    }                                                                                                        \
    for (int i = 0; i < R; i++) { memcpy(out + i * NB, &lo[i], 32); memcpy(out + i * NB + 8, &hi[i], 32); }   \
}
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

typedef void (*tile_fn)(const float *, idx, const float *, idx, const float *, idx, idx, float *);
static const tile_fn tiles[MT + 1] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

static void panels(const float *x, idx m, idx k, const float *p, idx n, const float *bias, float *y,
                   idx first, idx last) {
    float out[MT * NB];
    for (idx q = first; q < last; q++) {
        const float *pq = p + q * k * NB;
        const float *next = q + 1 < last ? pq + k * NB : NULL;
        idx c0 = q * NB, cols = n - c0 < NB ? n - c0 : NB;
        idx count = (m + MT - 1) / MT;
        for (idx t = 0, m0 = 0; m0 < m; m0 += MT, t++) {
            idx r = m - m0 < MT ? m - m0 : MT;
            tiles[r](x + m0 * k, k, pq, k, next, t * k / count, count, out);
            for (idx i = 0; i < r; i++) {
                float *row = y + (m0 + i) * n + c0;
                for (idx c = 0; c < cols; c++) row[c] = bias ? out[i * NB + c] + bias[c0 + c] : out[i * NB + c];
            }
        }
    }
}

/* y [m, n] = x [m, k] @ w.T + bias, w given as panels [ceil(n / NB)][k][NB]; bias may be NULL; on `threads`
   threads (torch's setting: an OpenMP thread's own default may differ) */
void panel_mm(const float *x, idx m, idx k, const float *p, idx n, const float *bias, float *y, int threads) {
    idx count = (n + NB - 1) / NB;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads) if (threads > 1 && count > 1 && m * k * n >= 65536)
    {
        idx t = omp_get_thread_num(), T = omp_get_num_threads();
        panels(x, m, k, p, n, bias, y, count * t / T, count * (t + 1) / T);
    }
#else
    (void)threads;
    panels(x, m, k, p, n, bias, y, 0, count);
#endif
}

/* 1 where the panels are split across OpenMP threads, 0 where this build has one thread */
int panel_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

"""

FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC")
OPENMP = ("-fopenmp",)  # tried first; the key covers it, so a library built without it is another library

_lock = threading.Lock()
_library: list[ctypes.CDLL | None] = []  # the library once tried (None: it could not be built or failed its check)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _machine() -> str:
    """What the compiled code depends on besides its source: the CPU's features (-march=native)."""
    try:
        with open("/proc/cpuinfo") as f:
            found = next((line for line in f if line.startswith(("flags", "Features"))), None)
    except OSError:
        found = None
    return found or f"{platform.machine()} {platform.processor()}"


def _run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=300, cwd=cwd)


class UntrustedCache(OSError):
    """The kernel cache folder could be changed by another user: nothing in it is loaded, nothing built there."""


def _key(flags: tuple[str, ...], version: str, source: str | None = None, libs: tuple[str, ...] = ()) -> str:
    """What a library depends on: source (the panel kernel's by default), every flag (OpenMP's and -march's
    included), the libraries it links, compiler version, CPU features."""
    parts = [SOURCE if source is None else source, " ".join(flags), version, _machine()]
    return hashlib.sha256("\0".join(parts + ([" ".join(libs)] if libs else [])).encode()).hexdigest()[:16]


def _not_private(st: os.stat_result) -> str | None:
    """Why a file or folder with this stat may hold another user's code (None when only this user can write it)."""
    if not hasattr(os, "getuid"):  # no POSIX owners here
        return None
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _private_folder(folder: Path) -> None:
    """Makes `folder` (mode 700) where it is missing; UntrustedCache unless it is a folder of this user that no
    one else may write, in a parent no one else may swap it in."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    problem = "a link or a file, not a folder" if not stat.S_ISDIR(st.st_mode) else _not_private(st)
    if problem is None and hasattr(os, "getuid"):
        up = os.stat(folder.parent)
        if up.st_uid not in (os.getuid(), 0) or (up.st_mode & 0o002 and not up.st_mode & stat.S_ISVTX):
            problem = f"in a folder other users can change (uid {up.st_uid}, mode {stat.S_IMODE(up.st_mode):o})"
    if problem is not None:
        raise UntrustedCache(f"{folder} is {problem}")


def _record_of(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _read_private(path: Path) -> bytes:
    """The bytes of `path`, opened without following a link; OSError if another user may have written them."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        problem = "not a regular file" if not stat.S_ISREG(st.st_mode) else _not_private(st)
        if problem is not None:
            raise OSError(problem)
        return f.read()


def _load_verified(target: Path) -> ctypes.CDLL | None:
    """The library at `target` if its bytes hash to the sha256 recorded beside it when it was built, both files
    this user's alone; None when it is missing or (after one log line) refused. The bytes hashed are the bytes
    loaded: the library is opened once and loaded through that descriptor where /proc shows it, which then stays
    open (dlopen takes a name it loaded before for the same library: /proc/self/fd/N must not name another)."""
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("The cached kernel %s is not loaded (%s): it is built again.", target, err.strerror or err)
        return None
    try:
        st = os.fstat(fd)
        problem = "not a regular file" if not stat.S_ISREG(st.st_mode) else _not_private(st)
        if problem is None:
            with open(fd, "rb", closefd=False) as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            try:
                recorded = _read_private(_record_of(target)).decode("ascii", "replace").strip()
            except OSError as err:
                recorded, problem = "", f"its sha256 record: {err.strerror or err}"
            if problem is None and not hmac.compare_digest(digest, recorded):
                problem = "its sha256 is not the one recorded when it was built"
        if problem is not None:
            log.warning("The cached kernel %s is not loaded (%s): it is built again.", target, problem)
            return None
        path = f"/proc/self/fd/{fd}"
        if not os.path.exists(path):
            return ctypes.CDLL(str(target))
        lib = ctypes.CDLL(path)
        fd = -1  # held for the life of the process, as the library is
        return lib
    finally:
        if fd >= 0:
            os.close(fd)


def _compile(cc: str, flags: tuple[str, ...], target: Path, source: str, libs: tuple[str, ...] = ()) -> str | None:
    """Builds `target` from `source` with its sha256 record beside it (each written whole, then renamed into
    place: another process building the same library meanwhile is harmless); the compiler's complaint when it
    fails."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        # relative names: the library's bytes do not depend on the temporary folder, so concurrent builds agree
        Path(tmp, "kernel.c").write_text(source)
        done = _run([cc, *flags, "kernel.c", "-o", "kernel.so", *libs], cwd=Path(tmp))
        if done.returncode != 0:
            return done.stderr.strip()
        out, record = Path(tmp, "kernel.so"), Path(tmp, "kernel.sha256")
        os.chmod(out, 0o700)
        record.write_text(hashlib.sha256(out.read_bytes()).hexdigest() + "\n")
        os.chmod(record, 0o600)
        os.replace(record, _record_of(target))
        os.replace(out, target)
    return None


def build_and_load(cc: str, folder: Path, stem: str, source: str, variants: tuple[tuple[str, ...], ...],
                   libs: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The one way a kernel of ours is built and loaded (this one and quant_matmul's): the library of `source`,
    compiled with the first of `variants` (each a full set of flags) that builds, kept in `folder` as
    `{stem}-{key}.so` with its sha256 beside it, loaded only from a folder of this user's alone and only when its
    bytes match that record (else built again). OSError when no variant builds, UntrustedCache (an OSError) when
    the folder is not this user's alone. The caller checks the library's results before it uses it."""
    _private_folder(folder)
    version = _run([cc, "--version"]).stdout
    errors = ""
    for flags in variants:
        target = folder / f"{stem}-{_key(flags, version, source, libs)}.so"
        lib = _load_verified(target)
        if lib is None:
            errors = _compile(cc, flags, target, source, libs) or ""
            lib = None if errors else _load_verified(target)
        if lib is not None:
            return lib
    lines = errors.splitlines()
    raise OSError(next((line for line in lines if "error" in line), lines[-1] if lines else f"{cc} failed"))


def _build(cc: str, folder: Path) -> ctypes.CDLL:
    """The panel kernel's library, loaded (`build_and_load`): with OpenMP first, then without (one thread,
    `panel_threaded`)."""
    return build_and_load(cc, folder, "panel_matmul", SOURCE, (FLAGS + OPENMP, FLAGS))


def _checked(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` once it computes a small product with partial panels and tiles as F.linear does (ValueError if not):
    a compiler that miscompiles it must not reach the exact mode."""
    lib.panel_mm.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p,
                             ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.panel_mm.restype = None
    gen = torch.Generator().manual_seed(0)
    weight, bias, x = (torch.randn(*shape, generator=gen) for shape in ((50, 33), (50,), (7, 33)))
    panels, got = pack(weight), torch.empty(7, 50)  # [4, 33, 16], [m, n]
    lib.panel_mm(x.data_ptr(), 7, 33, panels.data_ptr(), 50, bias.data_ptr(), got.data_ptr(), 1)
    if not torch.allclose(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-4, atol=1e-4):
        raise ValueError("its results differ from F.linear's")
    if not lib.panel_threaded():
        log.warning("The panel kernel was built without OpenMP (%s): its matmuls run on one thread.", FLAGS[1])
    return lib


def kernel_folder() -> Path:
    from rest_lsp.engine.model_source import cache_root

    return cache_root() / "kernels"


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built and checked on first use (None where it cannot be: then say why, once)."""
    if _library:
        return _library[0]
    with _lock:
        if _library:
            return _library[0]
        lib = None
        cc = _compiler()
        if cc is None:
            log.info("No C compiler here (CC, cc, gcc): fp32 steps run without rest-lsp's panel kernel (on oneDNN "
                     "where torch has it).")
        else:
            try:
                lib = _checked(_build(cc, kernel_folder()))
            except UntrustedCache as err:
                log.warning("The kernel cache folder is not this user's alone (%s): fp32 steps run without "
                            "rest-lsp's panel kernel (on oneDNN where torch has it).", err)
            except Exception as err:  # noqa: BLE001 - whatever went wrong, the step runs on what torch has
                log.warning("The panel kernel could not be built with %s (%s): fp32 steps run without it (on oneDNN "
                            "where torch has it).", cc, err)
                lib = None
        _library.append(lib)
        return lib


def available() -> bool:
    return library() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (fp32) -> panels [ceil(N / PANEL), K, PANEL], the columns past N zero."""
    n, k = weight.shape
    rows = -(-n // PANEL) * PANEL
    padded = torch.zeros(rows, k, dtype=torch.float32)
    padded[:n] = weight.detach().float()
    return padded.view(rows // PANEL, PANEL, k).transpose(1, 2).contiguous()


def panel_mm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [m, K] @ W.T + bias -> [m, n], W given by `pack`."""
    lib = library()
    if lib is None:
        raise RuntimeError("the panel kernel is not available on this machine")
    x = x.contiguous()
    m, k = x.shape
    # called ~120 times a step: the checks stay cheap attribute reads (`is_cpu`, not a loop over `device.type`)
    if (x.dtype != torch.float32 or panels.dtype != torch.float32 or panels.dim() != 3 or panels.shape[1:] != (k, PANEL)
            or panels.shape[0] * PANEL < n or not panels.is_contiguous() or not (x.is_cpu and panels.is_cpu)
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous() or bias.numel() < n
                                      or not bias.is_cpu))):
        raise ValueError(f"panel_mm: input [{m}, {k}] {x.dtype} does not fit panels {list(panels.shape)} "
                         f"{panels.dtype} for {n} outputs" + ("" if bias is None else f", bias [{bias.numel()}]"))
    y = torch.empty(m, n, dtype=torch.float32)  # [m, n]
    if m:
        lib.panel_mm(x.data_ptr(), m, k, panels.data_ptr(), n, None if bias is None else bias.data_ptr(),
                     y.data_ptr(), torch.get_num_threads())
    return y


# The op TorchScript calls (torch.ops.rest_lsp.panel_mm): defined once per process.
_ops = torch.library.Library("rest_lsp", "DEF")
_ops.define("panel_mm(Tensor x, Tensor panels, int n, Tensor? bias) -> Tensor")
_ops.impl("panel_mm", panel_mm, "CPU")
