"""A screenshot of the Neovim plugin showing a real completion: Neovim runs in tmux with the plugin and the real
server, the script types into it, waits for the ghost text, and renders `tmux capture-pane -e` to a PNG.

    python editors/nvim/scripts/screenshot.py OUT.png [--scene line|block] [--nvim PATH] [--server "rest-lsp --stdio"]

Needs tmux, Neovim 0.11+ and Pillow (matplotlib's dependency); the font is DejaVu Sans Mono from matplotlib.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib
from PIL import Image, ImageDraw, ImageFont

PLUGIN = Path(__file__).resolve().parent.parent
COLS, ROWS = 96, 26
SESSION = "rest-lsp-shot"

LIB = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def factorial(n):
    """Return n factorial."""
    if n < 2:
        return 1
    return n * factorial(n - 1)
'''

MAIN = '''from lib import factorial, fibonacci


def print_table(limit):
    """Print i, fibonacci(i) and factorial(i) for i below limit."""
    for i in range(limit):
        print(i, fibonacci(i), factorial(i))


def sum_of_squares(values):
    total = 0
    for value in values:
        total = total + value * value
    return total


def sum_of_cubes(values):
'''

INIT = '''vim.opt.runtimepath:prepend({plugin!r})
vim.opt.swapfile = false
vim.o.number = true
vim.o.laststatus = 2
vim.o.shada = ""
vim.cmd("runtime plugin/rest_lsp.lua")
require("rest_lsp").setup({{ cmd = vim.json.decode({cmd!r}), filetypes = {{ "python" }}, ghost = "plugin",
  settings = {{ max_new_tokens = 48, cache_dir = {cache!r} }} }})
'''

# xterm's 16 colours (tmux passes Neovim's truecolor through when the outer terminal says it has it).
BASIC = [(0, 0, 0), (205, 0, 0), (0, 205, 0), (205, 205, 0), (0, 0, 238), (205, 0, 205), (0, 205, 205),
         (229, 229, 229), (127, 127, 127), (255, 0, 0), (0, 255, 0), (255, 255, 0), (92, 92, 255),
         (255, 0, 255), (0, 255, 255), (255, 255, 255)]
DEFAULT_FG, DEFAULT_BG = (224, 226, 234), (20, 22, 27)


def color256(n: int) -> tuple[int, int, int]:
    if n < 16:
        return BASIC[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    v = 8 + 10 * (n - 232)
    return v, v, v


def parse_sgr(params: list[int], st: dict) -> None:
    i = 0
    if not params:
        params = [0]
    while i < len(params):
        p = params[i]
        if p == 0:
            st.update(fg=None, bg=None, bold=False, italic=False, reverse=False, dim=False)
        elif p == 1:
            st["bold"] = True
        elif p == 2:
            st["dim"] = True
        elif p == 3:
            st["italic"] = True
        elif p == 7:
            st["reverse"] = True
        elif p == 22:
            st["bold"] = st["dim"] = False
        elif p == 23:
            st["italic"] = False
        elif p == 27:
            st["reverse"] = False
        elif 30 <= p <= 37:
            st["fg"] = BASIC[p - 30]
        elif 90 <= p <= 97:
            st["fg"] = BASIC[p - 90 + 8]
        elif 40 <= p <= 47:
            st["bg"] = BASIC[p - 40]
        elif 100 <= p <= 107:
            st["bg"] = BASIC[p - 100 + 8]
        elif p == 39:
            st["fg"] = None
        elif p == 49:
            st["bg"] = None
        elif p in (38, 48) and i + 1 < len(params):
            key = "fg" if p == 38 else "bg"
            if params[i + 1] == 5 and i + 2 < len(params):
                st[key] = color256(params[i + 2])
                i += 2
            elif params[i + 1] == 2 and i + 4 < len(params):
                st[key] = tuple(params[i + 2:i + 5])
                i += 4
        i += 1


SGR = re.compile(r"\x1b\[([0-9;:]*)m")


def render(ansi: str, cursor: tuple[int, int], out: Path) -> None:
    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    size = 16
    regular = ImageFont.truetype(str(fonts / "DejaVuSansMono.ttf"), size)
    bold = ImageFont.truetype(str(fonts / "DejaVuSansMono-Bold.ttf"), size)
    italic = ImageFont.truetype(str(fonts / "DejaVuSansMono-Oblique.ttf"), size)
    cw = round(regular.getlength("M"))
    ch = round(size * 1.35)
    pad = 12
    img = Image.new("RGB", (COLS * cw + 2 * pad, ROWS * ch + 2 * pad), DEFAULT_BG)
    draw = ImageDraw.Draw(img)
    st = dict(fg=None, bg=None, bold=False, italic=False, reverse=False, dim=False)
    for row, line in enumerate(ansi.split("\n")[:ROWS]):
        col, pos = 0, 0
        for m in list(SGR.finditer(line)) + [None]:
            end = m.start() if m else len(line)
            for char in line[pos:end]:
                fg, bg = st["fg"] or DEFAULT_FG, st["bg"] or DEFAULT_BG
                if st["reverse"]:
                    fg, bg = bg, fg
                if st["dim"]:
                    fg = tuple((a + b) // 2 for a, b in zip(fg, bg))
                x, y = pad + col * cw, pad + row * ch
                if bg != DEFAULT_BG:
                    draw.rectangle([x, y, x + cw - 1, y + ch - 1], fill=bg)
                font = bold if st["bold"] else italic if st["italic"] else regular
                draw.text((x, y + (ch - size) // 2 - 1), char, font=font, fill=fg)
                col += 1
            if m is None:
                break
            parse_sgr([int(p) if p else 0 for p in re.split("[;:]", m.group(1))] if m.group(1) else [], st)
            pos = m.end()
    cx, cy = cursor  # Neovim's insert-mode cursor: a bar
    draw.rectangle([pad + cx * cw, pad + cy * ch + 2, pad + cx * cw + 1, pad + (cy + 1) * ch - 3], fill=DEFAULT_FG)
    img.save(out)


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def nvim_eval(nvim: str, sock: str, expr: str) -> str:
    return subprocess.run([nvim, "--server", sock, "--remote-expr", expr], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--nvim", default=shutil.which("nvim") or str(Path(sys.executable).parent / "nvim"))
    ap.add_argument("--server", default=None, help='server command (default: "rest-lsp --stdio" beside this Python)')
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--scene", choices=("line", "block"), default="line",
                    help="line: mid-line, the rest of the line; block: on an empty line, a whole block")
    args = ap.parse_args()
    server = args.server.split() if args.server else [str(Path(sys.executable).parent / "rest-lsp"), "--stdio"]

    work = Path(tempfile.mkdtemp(prefix="rest-lsp-shot-"))
    ws = work / "demo"
    (ws / ".git").mkdir(parents=True)
    (ws / "lib.py").write_text(LIB)
    (ws / "main.py").write_text(MAIN)
    init = work / "init.lua"
    init.write_text(INIT.format(plugin=str(PLUGIN), cmd=json.dumps(server), cache=str(work / "cache")))
    sock = str(work / "nvim.sock")

    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    tmux("-f", "/dev/null", "new-session", "-d", "-s", SESSION, "-x", str(COLS), "-y", str(ROWS), "-c", str(ws),
         "env", "TERM=tmux-256color", "COLORTERM=truecolor", args.nvim, "--clean", "-u", str(init),
         "--listen", sock, "main.py")
    tmux("set-option", "-t", SESSION, "-g", "status", "off")
    try:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            ready = Path(sock).exists() and nvim_eval(args.nvim, sock, (
                "luaeval('(function() local c = vim.lsp.get_clients({name=\"rest_lsp\"})[1]; if not c then "
                "return 0 end; local r = c:request_sync(\"workspace/executeCommand\", {command=\"rest-lsp.stats\","
                " arguments={}}, 3000, 0); return (r and r.result and r.result.ready) and 1 or 0 end)()')"))
            if ready == "1":
                break
            time.sleep(1)
        else:
            print("the server did not get ready in time", file=sys.stderr)
            return 1
        # Type the start of a body, a key at a time, as a user would; stop at the first ghost text.
        tmux("send-keys", "-t", SESSION, "G", "A")
        keys = ["Enter", "t", "o", "t", "a", "l", " ", "=", " ", "0", "Enter"]
        if args.scene == "line":
            keys += ["f", "o", "r"]
        for key in keys:
            tmux("send-keys", "-t", SESSION, key)
            time.sleep(0.15)
        ghost = False
        for _ in range(120):
            n = nvim_eval(args.nvim, sock, "luaeval('#vim.api.nvim_buf_get_extmarks(0, "
                                           "require(\"rest_lsp.ghost\").namespace, 0, -1, {})')")
            if n not in ("", "0"):
                ghost = True
                break
            time.sleep(0.5)
        if not ghost:
            print("no ghost text appeared", file=sys.stderr)
            return 1
        time.sleep(0.5)
        ansi = tmux("capture-pane", "-p", "-e", "-t", SESSION)
        cx, cy = (int(v) for v in tmux("display-message", "-p", "-t", SESSION, "#{cursor_x} #{cursor_y}").split())
        render(ansi, (cx, cy), args.out)
        print(f"wrote {args.out}")
        return 0
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
