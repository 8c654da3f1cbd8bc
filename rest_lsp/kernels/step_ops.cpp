/* The step's kernel calls as native torch ops: quant_mm, panel_mm and row_attn registered with torch's dispatcher through its
   stable C ABI (torch/csrc/stable/c/shim.h: boxed kernels over StableIValue stacks), so that TorchScript calls
   them without a round trip through Python. No torch header is included: the few C entry points are declared
   here as libtorch exports them, so this builds in a second with the C compiler's C++ front end.

   The kernels' arithmetic is not here: each op checks its tensors (dtype, device, dims, layout) the way the Python
   wrappers do, then calls the kernel library's own entry point (quant_matmul.c, panel_matmul.c, row_attention.c),
   bound by `step_bind`, with every buffer's extent, as the Python wrappers call it. Two ops do their own: rope_cache,
   a layer's rotation and cache writes, the same IEEE operations as the torch ops it replaces; rms_norm, a norm's
   few torch ops in one call, to rounding. A refusal is a C++
   exception (RuntimeError in Python) after the argument handles are released. */

#include <stdint.h>
#include <stdexcept>
#include <string>

extern "C" {
typedef int32_t AOTITorchError;
struct AtenTensorOpaque;
typedef AtenTensorOpaque *AtenTensorHandle;
struct TorchLibraryOpaque;
typedef TorchLibraryOpaque *TorchLibraryHandle;
typedef uint64_t StableIValue;

AOTITorchError aoti_torch_library_init_impl(const char *, const char *, const char *, uint32_t, TorchLibraryHandle *);
AOTITorchError aoti_torch_library_impl(TorchLibraryHandle, const char *, void (*)(StableIValue *, uint64_t, uint64_t));
AOTITorchError aoti_torch_delete_library_object(TorchLibraryHandle);
AOTITorchError aoti_torch_get_data_ptr(AtenTensorHandle, void **);
AOTITorchError aoti_torch_get_sizes(AtenTensorHandle, int64_t **);
AOTITorchError aoti_torch_get_strides(AtenTensorHandle, int64_t **);
AOTITorchError aoti_torch_get_dim(AtenTensorHandle, int64_t *);
AOTITorchError aoti_torch_get_dtype(AtenTensorHandle, int32_t *);
AOTITorchError aoti_torch_get_device_type(AtenTensorHandle, int32_t *);
AOTITorchError aoti_torch_get_storage_size(AtenTensorHandle, int64_t *);
AOTITorchError aoti_torch_get_storage_offset(AtenTensorHandle, int64_t *);
AOTITorchError aoti_torch_delete_tensor_object(AtenTensorHandle);
AOTITorchError aoti_torch_empty_strided(int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t,
                                        AtenTensorHandle *);
int32_t aoti_torch_dtype_float32();
int32_t aoti_torch_dtype_uint8();
int32_t aoti_torch_dtype_int64();
int32_t aoti_torch_device_type_cpu();
}

namespace at {
int get_num_threads();  // torch's intra-op threads, as the Python wrappers pass torch.get_num_threads()
}

typedef long long idx;
typedef int (*quant_mm_fn)(const float *, idx, idx, idx, const uint8_t *, idx, idx, int, const float *, idx, float *,
                           idx, int);
typedef int (*panel_mm_fn)(const float *, idx, idx, idx, const float *, idx, idx, const float *, idx, float *, idx,
                            int);
typedef int (*row_attn_fn)(const float *, idx, idx, idx, idx, idx, const float *, const float *, idx, idx, idx,
                           const float *, idx, idx, idx, float, float *, idx, int);

static quant_mm_fn quant_mm_entry;
static row_attn_fn row_attn_entry;
static panel_mm_fn panel_mm_entry;

namespace {

/* One tensor argument: the handle the stack gave (owned: released at scope end) and what the checks read. */
struct Arg {
    AtenTensorHandle h;
    int64_t dim = 0, *sizes = nullptr, *strides = nullptr, offset = 0, bytes = 0;
    int32_t dtype = -1, device = -1;
    void *data = nullptr;

    explicit Arg(StableIValue v) : h(reinterpret_cast<AtenTensorHandle>(v)) {
        if (aoti_torch_get_dim(h, &dim) || aoti_torch_get_sizes(h, &sizes) || aoti_torch_get_strides(h, &strides)
            || aoti_torch_get_dtype(h, &dtype) || aoti_torch_get_device_type(h, &device)
            || aoti_torch_get_storage_offset(h, &offset) || aoti_torch_get_storage_size(h, &bytes)
            || aoti_torch_get_data_ptr(h, &data))
            dim = -1;
    }
    ~Arg() { aoti_torch_delete_tensor_object(h); }
    Arg(const Arg &) = delete;
    Arg &operator=(const Arg &) = delete;

    int64_t numel() const {
        int64_t n = 1;
        for (int64_t i = 0; i < dim; i++) n *= sizes[i];
        return n;
    }
    /* the elements of `size` bytes its storage holds from its data pointer on (buffers.py's `extent`) */
    idx extent(int64_t size) const { return (bytes - offset * size) / size; }
    bool contiguous() const {
        int64_t expect = 1;
        for (int64_t i = dim - 1; i >= 0; i--) {
            if (sizes[i] != 1 && strides[i] != expect) return false;
            expect *= sizes[i];
        }
        return true;
    }
    bool cpu_of(int32_t type, int64_t dims) const {
        return dim == dims && dtype == type && device == aoti_torch_device_type_cpu();
    }
};

AtenTensorHandle empty_rows(int64_t m, int64_t n) {
    int64_t sizes[2] = {m, n}, strides[2] = {n, 1};
    AtenTensorHandle out = nullptr;
    if (aoti_torch_empty_strided(2, sizes, strides, aoti_torch_dtype_float32(), aoti_torch_device_type_cpu(), 0, &out))
        throw std::runtime_error("rest_lsp_step: no memory for the output");
    return out;
}

void *data_of(AtenTensorHandle h) {
    void *p = nullptr;
    aoti_torch_get_data_ptr(h, &p);
    return p;
}

/* buffers.py's `outcome`: the kernel's code as one sentence */
void outcome(const char *name, int rc, const char *unsupported, AtenTensorHandle out) {
    if (rc >= 0) return;
    aoti_torch_delete_tensor_object(out);
    std::string why = rc == -1 ? "no scratch memory for this call"
                      : rc == -2 ? unsupported
                                 : "the sizes passed do not fit the buffers given (code " + std::to_string(rc) + ")";
    throw std::runtime_error(std::string(name) + ": " + why + ".");
}

/* quant_mm(Tensor x, Tensor panels, int n, Tensor bias, int bits) -> Tensor: quant_matmul.quant_mm, a bias of no
   elements standing for none. The panels' format (`bits`, a code of quant_matmul.py's) and their layout are the
   caller's (QuantMatmul's, made by pack_blocks): the kernel refuses a code it does not know and checks every
   buffer against its extent, so panels of another layout cannot make it read or write outside them. */
void quant_mm_boxed(StableIValue *stack, uint64_t, uint64_t) {
    Arg x(stack[0]), panels(stack[1]), bias(stack[3]);
    int64_t n = static_cast<int64_t>(stack[2]), bits = static_cast<int64_t>(stack[4]);
    const int32_t f32 = aoti_torch_dtype_float32();
    bool has_bias = bias.dim >= 0 && bias.numel() > 0;
    if (!x.cpu_of(f32, 2) || !x.contiguous() || !panels.cpu_of(aoti_torch_dtype_uint8(), 2) || !panels.contiguous()
        || n < 0 || bits < 0 || bits > INT32_MAX || panels.sizes[0] * 16 < n || bias.dim < 0
        || (has_bias && (!bias.cpu_of(f32, 1) || bias.numel() < n)))
        throw std::runtime_error("quant_mm: the input does not fit the panels (or is not contiguous fp32 rows)");
    if (!quant_mm_entry) throw std::runtime_error("quant_mm: no quantized kernel is bound");
    int64_t m = x.sizes[0];
    AtenTensorHandle y = empty_rows(m, n);
    if (m) {
        int rc = quant_mm_entry(static_cast<const float *>(x.data), x.extent(4), m, x.sizes[1],
                                static_cast<const uint8_t *>(panels.data), panels.extent(1), n, (int)bits,
                                has_bias ? static_cast<const float *>(bias.data) : nullptr,
                                has_bias ? bias.extent(4) : 0, static_cast<float *>(data_of(y)), m * n,
                                at::get_num_threads());
        outcome("quant_mm", rc, "no panels of this format", y);
    }
    stack[0] = reinterpret_cast<StableIValue>(y);
}

/* row_attn(Tensor q, Tensor k, Tensor v, int keys, Tensor mask, int mask_from, float scale) -> Tensor:
   row_attention.row_attn, a mask of no elements standing for none */
void row_attn_boxed(StableIValue *stack, uint64_t, uint64_t) {
    Arg q(stack[0]), k(stack[1]), v(stack[2]), mask(stack[4]);
    int64_t keys = static_cast<int64_t>(stack[3]), from = static_cast<int64_t>(stack[5]);
    double scale;
    static_assert(sizeof(double) == sizeof(StableIValue), "a float argument is a double's bits");
    __builtin_memcpy(&scale, &stack[6], sizeof scale);
    const int32_t f32 = aoti_torch_dtype_float32();
    bool masked = mask.dim >= 0 && mask.numel() > 0;
    bool ok = q.cpu_of(f32, 3) && q.contiguous() && k.cpu_of(f32, 3) && v.cpu_of(f32, 3) && mask.dim >= 0;
    if (ok) {
        int64_t hq = q.sizes[0], d = q.sizes[2], hkv = k.sizes[0];
        for (int i = 0; i < 3; i++) ok = ok && k.sizes[i] == v.sizes[i] && k.strides[i] == v.strides[i];
        ok = ok && k.sizes[2] == d && k.strides[2] == 1 && k.strides[1] == d && k.strides[0] >= 0 && hkv > 0
             && hq % hkv == 0 && 0 <= from && from <= keys && keys <= k.sizes[1];
        if (masked)
            ok = ok && mask.cpu_of(f32, 2) && mask.sizes[0] == q.sizes[1] && mask.sizes[1] == keys - from
                 && mask.strides[0] >= 0 && mask.strides[1] == 1;
    }
    if (!ok) throw std::runtime_error("row_attn: q does not fit the caches, keys or mask");
    if (!row_attn_entry) throw std::runtime_error("row_attn: no row-exact attention kernel is bound");
    int64_t hq = q.sizes[0], n = q.sizes[1], d = q.sizes[2];
    AtenTensorHandle out = empty_rows(n, hq * d);
    if (n) {
        idx kvn = k.extent(4) < v.extent(4) ? k.extent(4) : v.extent(4);
        int rc = row_attn_entry(static_cast<const float *>(q.data), q.extent(4), n, hq, k.sizes[0], d,
                                static_cast<const float *>(k.data), static_cast<const float *>(v.data), kvn,
                                k.strides[0], masked ? from : keys,
                                masked ? static_cast<const float *>(mask.data) : nullptr, masked ? mask.extent(4) : 0,
                                masked ? mask.sizes[1] : 0, masked ? mask.strides[0] : 0, (float)scale,
                                static_cast<float *>(data_of(out)), n * hq * d, at::get_num_threads());
        outcome("row_attn", rc, "a row with no keys, more than 64 query heads a key head, or heads over 1024 wide",
                out);
    }
    stack[0] = reinterpret_cast<StableIValue>(out);
}

/* panel_mm(Tensor x, Tensor panels, int n, Tensor bias) -> Tensor: panel_matmul.panel_mm, a bias of no elements
   standing for none */
void panel_mm_boxed(StableIValue *stack, uint64_t, uint64_t) {
    Arg x(stack[0]), panels(stack[1]), bias(stack[3]);
    int64_t n = static_cast<int64_t>(stack[2]);
    const int32_t f32 = aoti_torch_dtype_float32();
    bool has_bias = bias.dim >= 0 && bias.numel() > 0;
    if (!x.cpu_of(f32, 2) || !x.contiguous() || !panels.cpu_of(f32, 3) || !panels.contiguous()
        || panels.sizes[1] != x.sizes[1] || panels.sizes[2] != 16 || n < 0 || panels.sizes[0] * 16 < n
        || bias.dim < 0 || (has_bias && (!bias.cpu_of(f32, 1) || bias.numel() < n)))
        throw std::runtime_error("panel_mm: the input does not fit the panels (or is not contiguous fp32 rows)");
    if (!panel_mm_entry) throw std::runtime_error("panel_mm: no panel kernel is bound");
    int64_t m = x.sizes[0];
    AtenTensorHandle y = empty_rows(m, n);
    if (m) {
        int rc = panel_mm_entry(static_cast<const float *>(x.data), x.extent(4), m, x.sizes[1],
                                static_cast<const float *>(panels.data), panels.extent(4), n,
                                has_bias ? static_cast<const float *>(bias.data) : nullptr,
                                has_bias ? bias.extent(4) : 0, static_cast<float *>(data_of(y)), m * n,
                                at::get_num_threads());
        outcome("panel_mm", rc, "", y);
    }
    stack[0] = reinterpret_cast<StableIValue>(y);
}

/* rope_cache(Tensor qkv, Tensor cos, Tensor sin, Tensor k_cache, Tensor v_cache, int past, Tensor rows, int heads)
   -> Tensor: a layer's queries and keys rotated and its keys and values written into the cache, what lean_llama's
   torch ops do, bit for bit. qkv [n, (Hq + 2 Hkv) D] (the fused matmul's rows); cos, sin [1, n, D] (sin's first
   half negated); the caches [Hkv, capacity, D]; rows [n] cache rows (int64), or none (no elements): rows past on.
   Returns q [Hq, n, D]. A rotated element is x[d] cos[d] + x[(d + D/2) mod D] sin[d]: two products and a sum,
   each rounded as torch's ops round them (built with -ffp-contract=off: never one fused multiply-add). */
void rope_cache_boxed(StableIValue *stack, uint64_t, uint64_t) {
    Arg qkv(stack[0]), cos(stack[1]), sin(stack[2]), kc(stack[3]), vc(stack[4]), rows(stack[6]);
    int64_t past = static_cast<int64_t>(stack[5]), hq = static_cast<int64_t>(stack[7]);
    const int32_t f32 = aoti_torch_dtype_float32();
    bool ok = qkv.cpu_of(f32, 2) && qkv.contiguous() && kc.cpu_of(f32, 3) && vc.cpu_of(f32, 3) && rows.dim >= 0
              && cos.dim >= 1 && sin.dim >= 1 && hq > 0;
    int64_t n = ok ? qkv.sizes[0] : 0, hkv = ok ? kc.sizes[0] : 0, d = ok ? kc.sizes[2] : 0;
    bool slots = ok && rows.numel() > 0;
    if (ok) {
        for (int i = 0; i < 3; i++) ok = ok && kc.sizes[i] == vc.sizes[i] && kc.strides[i] == vc.strides[i];
        ok = ok && d > 0 && d % 2 == 0 && kc.strides[2] == 1 && kc.strides[1] == d && kc.strides[0] >= 0
             && qkv.sizes[1] == (hq + 2 * hkv) * d;
        ok = ok && cos.dtype == f32 && sin.dtype == f32 && cos.device == qkv.device && sin.device == qkv.device
             && cos.contiguous() && sin.contiguous() && cos.numel() == n * d && sin.numel() == n * d
             && cos.sizes[cos.dim - 1] == d && sin.sizes[sin.dim - 1] == d;
        ok = ok && (slots ? rows.cpu_of(aoti_torch_dtype_int64(), 1) && rows.contiguous() && rows.numel() == n
                          : past >= 0 && past <= kc.sizes[1] - n);
        ok = ok && kc.extent(4) >= (hkv - 1) * kc.strides[0] + kc.sizes[1] * d
             && vc.extent(4) >= (hkv - 1) * vc.strides[0] + vc.sizes[1] * d && cos.extent(4) >= n * d
             && sin.extent(4) >= n * d && qkv.extent(4) >= n * (hq + 2 * hkv) * d;
    }
    if (ok && slots) {
        const int64_t *r = static_cast<const int64_t *>(rows.data);
        for (int64_t t = 0; t < n; t++) ok = ok && r[t] >= 0 && r[t] < kc.sizes[1];
    }
    if (!ok) throw std::runtime_error("rope_cache: the rows do not fit the heads, rotation tables, caches or slots");
    int64_t sizes[3] = {hq, n, d}, strides[3] = {n * d, d, 1};
    AtenTensorHandle out = nullptr;
    if (aoti_torch_empty_strided(3, sizes, strides, f32, aoti_torch_device_type_cpu(), 0, &out))
        throw std::runtime_error("rope_cache: no memory for the output");
    float *q = static_cast<float *>(data_of(out));
    const float *x = static_cast<const float *>(qkv.data), *c = static_cast<const float *>(cos.data),
                *s = static_cast<const float *>(sin.data);
    float *K = static_cast<float *>(kc.data), *V = static_cast<float *>(vc.data);
    const int64_t *r = slots ? static_cast<const int64_t *>(rows.data) : nullptr;
    int64_t width = (hq + 2 * hkv) * d, half = d / 2;
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * width, *ct = c + t * d, *st = s + t * d;
        int64_t slot = r ? r[t] : past + t;
        for (int64_t h = 0; h < hq + hkv; h++) {
            const float *xh = xt + h * d;
            float *dst = h < hq ? q + (h * n + t) * d : K + (h - hq) * kc.strides[0] + slot * d;
            for (int64_t e = 0; e < d; e++) {
                float a = xh[e] * ct[e];
                float b = xh[e < half ? e + half : e - half] * st[e];
                dst[e] = a + b;
            }
        }
        for (int64_t g = 0; g < hkv; g++) {
            const float *xv = xt + (hq + hkv + g) * d;
            float *dst = V + g * vc.strides[0] + slot * d;
            for (int64_t e = 0; e < d; e++) dst[e] = xv[e];
        }
    }
    stack[0] = reinterpret_cast<StableIValue>(out);
}

/* rms_norm(Tensor x, Tensor weight, Tensor doubled, float eps) -> Tensor: transformers' RMSNorm of each row of x
   [n, H] in fp32, weight [H]: w[e] (x[e] r), r = 1 / sqrt(mean of the row's squares + eps), those two products and
   the root rounded to fp32 as torch's ops round them. The mean of squares is summed in double, then rounded once:
   at least as accurate as torch's fp32 reduction (or the layer-norm route the Python op takes), not bit for bit
   either. Each row alone, in one order: a row's bits do not depend on the rows beside it. `doubled` ([2H]: the
   weight twice) is the Python op's, unused here. */
#define RMS_ROWS 4  // rows whose sums of squares run side by side (a double add's latency hidden by the others)
void rms_norm_boxed(StableIValue *stack, uint64_t, uint64_t) {
    Arg x(stack[0]), w(stack[1]), doubled(stack[2]);
    double eps;
    __builtin_memcpy(&eps, &stack[3], sizeof eps);
    const int32_t f32 = aoti_torch_dtype_float32();
    bool ok = x.cpu_of(f32, 2) && x.contiguous() && w.cpu_of(f32, 1) && w.contiguous() && doubled.dim >= 0
              && w.sizes[0] == x.sizes[1] && x.sizes[1] > 0 && eps >= 0.0 && x.extent(4) >= x.numel()
              && w.extent(4) >= w.sizes[0];
    if (!ok) throw std::runtime_error("rms_norm: the rows do not fit the weight (or are not contiguous fp32 rows)");
    int64_t n = x.sizes[0], h = x.sizes[1];
    AtenTensorHandle out = empty_rows(n, h);
    const float *xs = static_cast<const float *>(x.data), *ws = static_cast<const float *>(w.data);
    float *ys = static_cast<float *>(data_of(out));
    for (int64_t t0 = 0; t0 < n; t0 += RMS_ROWS) {
        int64_t rows = n - t0 < RMS_ROWS ? n - t0 : RMS_ROWS;
        double squares[RMS_ROWS] = {0.0};
        if (rows == RMS_ROWS)  // the rows' chains side by side: each row's adds in its own order, e = 0, 1, ...
            for (int64_t e = 0; e < h; e++)
                for (int i = 0; i < RMS_ROWS; i++) squares[i] += (double)xs[(t0 + i) * h + e] * xs[(t0 + i) * h + e];
        else
            for (int64_t i = 0; i < rows; i++)
                for (int64_t e = 0; e < h; e++) squares[i] += (double)xs[(t0 + i) * h + e] * xs[(t0 + i) * h + e];
        for (int64_t i = 0; i < rows; i++) {
            const float *xt = xs + (t0 + i) * h;
            float mean = (float)(squares[i] / (double)h);
            float r = 1.0f / __builtin_sqrtf(mean + (float)eps);
            for (int64_t e = 0; e < h; e++) ys[(t0 + i) * h + e] = ws[e] * (xt[e] * r);
        }
    }
    stack[0] = reinterpret_cast<StableIValue>(out);
}

}  // namespace

extern "C" {

/* The kernel entry points the ops call (the libraries of one level); 0. */
int step_bind(void *quant_mm, void *row_attn, void *panel_mm) {
    quant_mm_entry = reinterpret_cast<quant_mm_fn>(quant_mm);
    row_attn_entry = reinterpret_cast<row_attn_fn>(row_attn);
    panel_mm_entry = reinterpret_cast<panel_mm_fn>(panel_mm);
    return 0;
}

/* Registers the ops' CPU kernels in namespace `ns` (whose schemas Python defined): the registration's handle (kept
   for the life of the process, as the ops are; `step_unregister` takes them back), NULL where torch refused. */
void *step_register(const char *ns) {
    TorchLibraryHandle lib = nullptr;
    if (aoti_torch_library_init_impl(ns, "CPU", "step_ops.cpp", __LINE__, &lib)) return nullptr;
    if (aoti_torch_library_impl(lib, "quant_mm", quant_mm_boxed) || aoti_torch_library_impl(lib, "row_attn", row_attn_boxed)
        || aoti_torch_library_impl(lib, "panel_mm", panel_mm_boxed)
        || aoti_torch_library_impl(lib, "rope_cache", rope_cache_boxed)
        || aoti_torch_library_impl(lib, "rms_norm", rms_norm_boxed)) {
        aoti_torch_delete_library_object(lib);
        return nullptr;
    }
    return lib;
}

int step_unregister(void *registration) {
    return aoti_torch_delete_library_object(static_cast<TorchLibraryHandle>(registration));
}
}
