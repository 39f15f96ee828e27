#!/usr/bin/env python3
"""ansi2png.py - draw a tmux pane capture, colours and attributes included, to PNG with gnuplot.

Usage:
    tmux capture-pane -e -p -N -t PANE | scripts/ansi2png.py OUT.png COLS ROWS
    tmux capture-pane -e -p -N -t PANE | scripts/ansi2png.py --script OUT.png COLS ROWS | gnuplot

Reads the capture on stdin: text with ANSI SGR escape sequences (`-e`), one line per pane row;
`-N` keeps the trailing spaces of each line, so a bar or popup whose background runs to the right
edge keeps it (without it tmux trims them and they render on the default background). Writes a
gnuplot script for the pngcairo terminal and runs `gnuplot` on it (with --script it prints the
script to stdout instead and runs nothing). Python 3 standard library only.

What it understands: SGR 0 (reset), 1 bold, 2 dim, 3 italic, 4 underline, 7 reverse, 8 hidden,
9 strike-through and their 22-29 cancellations; colours 30-37/40-47, 90-97/100-107, 39/49 (the
defaults), 256 colours 38;5;N / 48;5;N and truecolour 38;2;R;G;B / 48;2;R;G;B (the colon forms too);
the VT100 line-drawing set (SO/SI, which tmux writes for cells drawn through it, or ESC ( 0 / ESC ( B),
shown as the Unicode lines. Other escape sequences (other CSI, OSC such as hyperlinks) are skipped.
Attributes carry over line ends, as tmux writes them.

How it draws: the pane is a fixed grid of CELL_W x CELL_H pixel cells on a dark background, the
axes set so that cell edges fall on pixel edges. Each run of cells with the same non-default
background (reverse video swaps foreground and background) is one filled rectangle. Text goes run
by run of same-attribute cells (one colour and face per run), each character a label centred in
its own cell rather than one string per run, so columns line up whatever advance the font or a
fallback font gives a glyph; wide characters (East Asian width W/F) take two cells, combining
marks join the character before them. Bold is the bold face, italic the oblique face, dim the
colour blended toward the background. Block elements (U+2580-U+259F: full and partial blocks,
quadrants, shades) and the light/heavy box-drawing lines (U+2500-U+257F) are rectangles that fill
their cells exactly, so bars and frames join up; other characters are DejaVu Sans Mono glyphs, and
one that no installed font has is an outlined box (see Coverage).
"""
import re
import subprocess
import sys
import unicodedata

CELL_W, CELL_H, PAD = 9, 18, 10
FONT, FONT_SIZE = "DejaVu Sans Mono", 11
CANVAS = "#1e2127"  # the default background
DEFAULT_FG = "#dcdfe4"
PALETTE16 = [
    "#1c1f24", "#e06c75", "#98c379", "#e5c07b", "#61afef", "#c678dd", "#56b6c2", "#abb2bf",
    "#5c6370", "#ff7b86", "#b5e890", "#ffd787", "#8cc8ff", "#e09cf0", "#7fd6e0", "#ffffff",
]


def color256(n):
    n = max(0, min(255, n))
    if n < 16:
        return PALETTE16[n]
    if n < 232:
        n -= 16
        lv = [0, 95, 135, 175, 215, 255]
        return "#%02x%02x%02x" % (lv[n // 36], lv[n // 6 % 6], lv[n % 6])
    g = 8 + 10 * (n - 232)
    return "#%02x%02x%02x" % (g, g, g)


def rgb(h):
    return int(h[1:3], 16), int(h[3:5], 16), int(h[5:7], 16)


def blend(fg, bg, a):
    """fg over bg with opacity a."""
    f, b = rgb(fg), rgb(bg)
    return "#%02x%02x%02x" % tuple(round(f[i] * a + b[i] * (1 - a)) for i in range(3))


class Attr:
    __slots__ = ("fg", "bg", "bold", "dim", "italic", "under", "rev", "hidden", "strike")

    def __init__(self):
        self.reset()

    def reset(self):
        self.fg = self.bg = None  # None: the default colour
        self.bold = self.dim = self.italic = self.under = self.rev = self.hidden = self.strike = False

    def key(self):
        return tuple(getattr(self, s) for s in self.__slots__)


def sgr(attr, params):
    """Apply one SGR parameter string ("1;38;5;208", "38:2::10:20:30", "") to attr."""
    groups = [[int(x) if x.isdigit() else None for x in p.split(":")] for p in params.split(";")] if params else [[0]]
    # flatten the semicolon form of extended colours into colon groups
    i = 0
    while i < len(groups):
        g = groups[i]
        c = g[0] if g[0] is not None else 0
        if c in (38, 48, 58) and len(g) == 1:
            kind = groups[i + 1][0] if i + 1 < len(groups) else None
            need = 1 if kind == 5 else 3 if kind == 2 else 0
            g = g + [kind] + [groups[j][0] if j < len(groups) else None for j in range(i + 2, i + 2 + need)]
            i += 1 + need
        i += 1
        if c == 0:
            attr.reset()
        elif c == 1:
            attr.bold = True
        elif c == 2:
            attr.dim = True
        elif c == 3:
            attr.italic = True
        elif c in (4, 21):
            attr.under = True
        elif c == 7:
            attr.rev = True
        elif c == 8:
            attr.hidden = True
        elif c == 9:
            attr.strike = True
        elif c == 22:
            attr.bold = attr.dim = False
        elif c == 23:
            attr.italic = False
        elif c == 24:
            attr.under = False
        elif c == 27:
            attr.rev = False
        elif c == 28:
            attr.hidden = False
        elif c == 29:
            attr.strike = False
        elif 30 <= c <= 37:
            attr.fg = PALETTE16[c - 30]
        elif 40 <= c <= 47:
            attr.bg = PALETTE16[c - 40]
        elif 90 <= c <= 97:
            attr.fg = PALETTE16[c - 90 + 8]
        elif 100 <= c <= 107:
            attr.bg = PALETTE16[c - 100 + 8]
        elif c == 39:
            attr.fg = None
        elif c == 49:
            attr.bg = None
        elif c in (38, 48):
            col = None
            if len(g) >= 3 and g[1] == 5 and g[2] is not None:
                col = color256(g[2])
            elif len(g) >= 5 and g[1] == 2:
                v = [x for x in g[2:] if x is not None][-3:]  # 38:2:CS:R:G:B carries a colour space id
                if len(v) == 3:
                    col = "#%02x%02x%02x" % tuple(max(0, min(255, x)) for x in v)
            if col is not None:
                if c == 38:
                    attr.fg = col
                else:
                    attr.bg = col


ESC_RE = re.compile(
    r"\x1b\[([0-9;:?<=>]*)([ -/]*)([@-~])"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes (charset selection ...)
)


def width(ch):
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


# The DEC special graphics set (VT100 line drawing) in Unicode. A program that
# draws lines through the alternate character set (ncurses does, where TERM is xterm*) leaves plain
# 'q', 'x' ... in the pane marked as line drawing; capture-pane -e shows the mark as SO ... SI.
ACS = dict(zip("+,-.0`abcdefghijklmnopqrstuvwxyz{|}~",
               "\u2192\u2190\u2191\u2193\u2588\u25c6\u2592\u2409\u240c\u240d\u240a\u00b0\u00b1\u2424"
               "\u240b\u2518\u2510\u250c\u2514\u253c\u23ba\u23bb\u2500\u23bc\u23bd\u251c\u2524\u2534"
               "\u252c\u2502\u2264\u2265\u03c0\u2260\u00a3\u00b7"))


def parse(text, cols, rows):
    """Grid of rows x cols cells: [char, attr key]; a wide character's second cell holds ''."""
    attr = Attr()
    acs = False  # in the line-drawing set: SO/SI or ESC ( 0 / ESC ( B; like the attributes it carries over lines
    blank = Attr().key()
    grid = [[[" ", blank] for _ in range(cols)] for _ in range(rows)]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for y, line in enumerate(lines[:rows]):
        x, pos = 0, 0
        chunks = []
        for m in ESC_RE.finditer(line):
            chunks.append((line[pos:m.start()], m))
            pos = m.end()
        chunks.append((line[pos:], None))
        for txt, m in chunks:
            for ch in txt:
                if ch == "\t":
                    nx = min(cols, (x // 8 + 1) * 8)
                    while x < nx:
                        grid[y][x] = [" ", attr.key()]
                        x += 1
                    continue
                if ch in "\x0e\x0f":
                    acs = ch == "\x0e"
                    continue
                if ord(ch) < 0x20 or 0x7f <= ord(ch) < 0xa0:
                    continue
                if acs:
                    ch = ACS.get(ch, ch)
                w = width(ch)
                if w == 0:
                    if 0 < x <= cols:
                        px = x - 1 if grid[y][x - 1][0] != "" else x - 2
                        grid[y][px][0] += ch
                    continue
                if x + w > cols:
                    x += w
                    continue
                grid[y][x] = [ch, attr.key()]
                if w == 2:
                    grid[y][x + 1] = ["", attr.key()]
                x += w
            if m is not None and m.group(0) in ("\x1b(0", "\x1b(B"):
                acs = m.group(0) == "\x1b(0"
            elif m is not None and m.group(3) == "m" and not m.group(2):
                p = m.group(1)
                if not p or p[0].isdigit() or p[0] in ";:":
                    sgr(attr, p)
    return grid


def colours(key):
    """(foreground, background or None for the canvas) of an attribute key, after reverse and dim."""
    fg, bg, bold, dim, italic, under, rev, hidden, strike = key
    fg = fg or DEFAULT_FG
    if rev:
        fg, bg = (bg or CANVAS), fg
    if dim:
        fg = blend(fg, bg or CANVAS, 0.55)
    return fg, bg


# Block elements as filled fractions of the cell: (x0, y0, x1, y1, opacity), y down.
E = 1 / 8
BLOCKS = {"\u2580": [(0, 0, 1, .5, 1)], "\u2588": [(0, 0, 1, 1, 1)], "\u2590": [(.5, 0, 1, 1, 1)],
          "\u2591": [(0, 0, 1, 1, .25)], "\u2592": [(0, 0, 1, 1, .5)], "\u2593": [(0, 0, 1, 1, .75)],
          "\u2594": [(0, 0, 1, E, 1)], "\u2595": [(1 - E, 0, 1, 1, 1)]}
for k in range(1, 8):
    BLOCKS[chr(0x2580 + k)] = [(0, 1 - k * E, 1, 1, 1)]  # lower k eighths
    BLOCKS[chr(0x2590 - k)] = [(0, 0, k * E, 1, 1)]  # left k eighths (U+2589..U+258F)
QUAD = {"\u2596": "3", "\u2597": "4", "\u2598": "1", "\u2599": "134", "\u259a": "14", "\u259b": "123",
        "\u259c": "124", "\u259d": "2", "\u259e": "23", "\u259f": "234"}
QR = {"1": (0, 0, .5, .5, 1), "2": (.5, 0, 1, .5, 1), "3": (0, .5, .5, 1, 1), "4": (.5, .5, 1, 1, 1)}
for ch, qs in QUAD.items():
    BLOCKS[ch] = [QR[q] for q in qs]

# Box drawing: arms (up, right, down, left), 1 light, 2 heavy; U+2500..U+254B and U+2574..U+257F.
_BOX = ("0101 0202 1010 2020 " + "- " * 8 +  # 2500-250B: lines (dashed ones stay glyphs)
        "0110 0210 0120 0220 0011 0012 0021 0022 1100 1200 2100 2200 1001 1002 2001 2002 "  # corners
        "1110 1210 2110 1120 2120 1220 2210 2220 1011 1012 2011 1021 2021 1022 2012 2022 "  # tees
        "0111 0112 0211 0212 0121 0122 0221 0222 1101 1102 1201 1202 2101 2102 2201 2202 "  # tees
        "1111 1112 1211 1212 2111 1121 2121 2112 2211 1122 1221 2212 1222 2122 2221 2222").split()
BOX = {chr(0x2500 + i): a for i, a in enumerate(_BOX) if a != "-"}
for i, a in enumerate("0001 1000 0100 0010 0002 2000 0200 0020 0201 1020 0102 2010".split()):
    BOX[chr(0x2574 + i)] = a
for ch, a in zip("\u256d\u256e\u256f\u2570", ("0110", "0011", "1001", "1100")):  # rounded corners
    BOX[ch] = a


def box_rects(arms):
    """Rectangles (x0, y0, x1, y1) in pixels within a cell for the arms of a box-drawing character."""
    cx, cy = CELL_W // 2, CELL_H // 2
    out = []
    th = [0, 1, 2]
    up, right, down, left = (int(c) for c in arms)
    hw = max(th[left], th[right], th[up], th[down])  # so the arms meet in a full square at the centre
    if up:
        out.append((cx, 0, cx + th[up], cy + hw))
    if down:
        out.append((cx, cy, cx + th[down], CELL_H))
    if left:
        out.append((0, cy, cx + hw, cy + th[left]))
    if right:
        out.append((cx, cy, CELL_W, cy + th[right]))
    return out


class Coverage:
    """Whether some installed font has a glyph for a character, asked of fontconfig (fc-match, fc-query,
    fc-list, installed with cairo). Pango draws a character no font has as a box many times the
    cell's size, covering the picture, so such characters are drawn here as a small outlined box.
    Without the fontconfig tools every character counts as covered."""

    def __init__(self, family):
        self.ranges, self.cache, self.ok = [], {}, True
        try:
            f = subprocess.run(["fc-match", "-f", "%{file}", family], capture_output=True, text=True).stdout
            cs = subprocess.run(["fc-query", "-f", "%{charset}", f], capture_output=True, text=True).stdout
            for r in cs.split():
                a, _, b = r.partition("-")
                self.ranges.append((int(a, 16), int(b or a, 16)))
        except (OSError, ValueError):
            self.ok = False

    def has(self, ch):
        if not self.ok or len(ch) != 1 or ord(ch) < 0x7f:
            return True
        c = ord(ch)
        if any(a <= c <= b for a, b in self.ranges):
            return True
        if c not in self.cache:
            r = subprocess.run(["fc-list", ":charset=%x" % c, "family"], capture_output=True, text=True)
            self.cache[c] = bool(r.stdout.strip())
        return self.cache[c]


def gq(s):
    """A gnuplot double-quoted string: backslash and double quote escaped with a backslash. (In a
    single-quoted string a quote is doubled, but gnuplot 5.4 cannot parse '''' for a lone quote.)
    Text with a backquote goes in single quotes: inside double quotes gnuplot runs `...` in a shell."""
    if "`" in s:
        return "'" + s.replace("'", "''") + "'"
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def script(grid, out, cols, rows):
    w, h = cols * CELL_W + 2 * PAD, rows * CELL_H + 2 * PAD
    L = [
        "set terminal pngcairo size %d,%d font %s noenhanced background %s" % (w, h, gq("%s,%d" % (FONT, FONT_SIZE)), gq(CANVAS)),
        "set output %s" % gq(out),
        "unset border; unset tics; unset key",
        "set lmargin at screen 0; set rmargin at screen 1; set bmargin at screen 0; set tmargin at screen 1",
        # axis units are pixels, y down: pngcairo puts screen 0..1 at pixel centres 0.5..size-0.5,
        # so these ranges make an integer coordinate a pixel edge and cell rectangles meet without seams
        "set xrange [0.5:%g]; set yrange [%g:0.5]" % (w - 0.5, h - 0.5),
    ]
    nobj = [0]

    def rect(x0, y0, x1, y1, col, layer):
        nobj[0] += 1
        L.append("set object %d rect from %g,%g to %g,%g fc rgb %s fs solid 1.0 noborder %s"
                 % (nobj[0], x0, y0, x1, y1, gq(col), layer))

    # backgrounds: one rectangle per run of cells with the same non-default background
    for y, row in enumerate(grid):
        x = 0
        while x < cols:
            bg = colours(row[x][1])[1]
            x1 = x + 1
            while x1 < cols and colours(row[x1][1])[1] == bg:
                x1 += 1
            if bg is not None:
                rect(PAD + x * CELL_W, PAD + y * CELL_H, PAD + x1 * CELL_W, PAD + (y + 1) * CELL_H, bg, "behind")
            x = x1

    # text: runs of same-attribute cells; glyphs one per cell, blocks and box lines as rectangles
    nlab = 0
    cover = Coverage(FONT)
    for y, row in enumerate(grid):
        top = PAD + y * CELL_H
        x = 0
        while x < cols:
            key = row[x][1]
            x1 = x + 1
            while x1 < cols and row[x1][1] == key:
                x1 += 1
            fg, bg = colours(key)
            bold, italic, under, hidden, strike = key[2], key[4], key[5], key[7], key[8]
            face = FONT + (":Bold" if bold else "") + (":Italic" if italic else "")
            for cx in range(x, x1):
                ch = row[cx][0]
                left = PAD + cx * CELL_W
                if hidden or ch in ("", " "):
                    continue
                if ch in BLOCKS:
                    for fx0, fy0, fx1, fy1, a in BLOCKS[ch]:
                        col = fg if a == 1 else blend(fg, bg or CANVAS, a)
                        rect(left + round(fx0 * CELL_W), top + round(fy0 * CELL_H),
                             left + round(fx1 * CELL_W), top + round(fy1 * CELL_H), col, "back")
                    continue
                if ch in BOX:
                    for bx0, by0, bx1, by1 in box_rects(BOX[ch]):
                        rect(left + bx0, top + by0, left + bx1, top + by1, fg, "back")
                    continue
                cw = CELL_W * (2 if cx + 1 < cols and row[cx + 1][0] == "" else 1)
                if not cover.has(ch[0]):  # no font has it: an outlined box, as terminals show
                    for bx0, by0, bx1, by1 in ((1, 3, cw - 1, 4), (1, CELL_H - 4, cw - 1, CELL_H - 3),
                                               (1, 3, 2, CELL_H - 3), (cw - 2, 3, cw - 1, CELL_H - 3)):
                        rect(left + bx0, top + by0, left + bx1, top + by1, fg, "back")
                    continue
                nlab += 1
                L.append("set label %d %s at %g,%g center front tc rgb %s font %s noenhanced"
                         % (nlab, gq(ch), left + cw / 2, top + CELL_H / 2 - 1, gq(fg), gq("%s,%d" % (face, FONT_SIZE))))
            if (under or strike) and not hidden:
                ly = top + CELL_H - 3 if under else top + CELL_H // 2 + 1
                rect(PAD + x * CELL_W, ly, PAD + x1 * CELL_W, ly + 1, fg, "front")
            x = x1
    L.append("plot -1 notitle")
    L.append("set output")
    return "\n".join(L) + "\n"


def main(argv):
    args = argv[1:]
    only_script = bool(args) and args[0] == "--script"
    if only_script:
        args = args[1:]
    if len(args) != 3 or not args[1].isdigit() or not args[2].isdigit():
        sys.stderr.write("usage: tmux capture-pane -e -p -N -t PANE | %s [--script] OUT.png COLS ROWS\n" % argv[0])
        return 2
    out, cols, rows = args[0], int(args[1]), int(args[2])
    text = sys.stdin.buffer.read().decode("utf-8", "replace").replace("\r", "")
    gp = script(parse(text, cols, rows), out, cols, rows)
    if only_script:
        sys.stdout.write(gp)
        return 0
    r = subprocess.run(["gnuplot"], input=gp.encode("utf-8"))
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
