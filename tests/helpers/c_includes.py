"""What the C sources of a folder import, for tests/engine/test_structure.py: a C module is a source and the header
of the same name (x.c and x.h); a header named after no source is a module of its own. Module A imports module B
when a file of A includes (`#include "..."`) a file of B, or when A calls a function that B alone defines (one that
is not `static` and that a file of the folder declares: a name another file can call). System includes (`<...>`) are
not read."""

from __future__ import annotations

import re
from pathlib import Path

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
# a line that opens a declaration at column 0: words and stars, then the name before "("
_HEAD = re.compile(r"^(?!static\b|typedef\b|return\b|#)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)[ \t]*\(", re.M)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _code(text: str) -> str:
    """The text without comments (kept as a space) and with string and character literals emptied."""
    text = _COMMENT.sub(" ", text)
    return _LITERAL.sub('""', text)


def _heads(code: str) -> tuple[set[str], set[str], str]:
    """(the functions defined here that other files can call: a head at column 0, not static, whose parameter list is
    followed by a body; the functions declared here: such a head followed by `;`; the code without those
    declarations, where a name followed by "(" is a call)."""
    defined, declared, cut = set(), set(), []
    for m in _HEAD.finditer(code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
            if depth == 0:
                break
        rest = code[i:].lstrip()
        if rest.startswith("{"):
            defined.add(m.group(1))
        elif rest.startswith(";"):
            declared.add(m.group(1))
            cut.append((m.start(), i))
    for a, b in reversed(cut):
        code = code[:a] + code[b:]
    return defined, declared, code


def c_modules(folder: Path) -> dict[str, list[Path]]:
    """Module name (the file name without .c or .h) -> its files."""
    out: dict[str, list[Path]] = {}
    for p in sorted(folder.iterdir()):
        if p.suffix in (".c", ".h"):
            out.setdefault(p.stem, []).append(p)
    return out


def c_import_graph(folder: Path) -> dict[str, set[str]]:
    """module -> the modules it includes a file of or calls a function of (a function declared in a file of the folder:
    a definition no file declares, such as lazymap.c's mmap that the loader interposes, is called by nobody here)."""
    mods = c_modules(folder)
    read = {p: _heads(_code(p.read_text(encoding="utf-8"))) for files in mods.values() for p in files}
    declared = set().union(*(d for _, d, _ in read.values()))
    definers: dict[str, set[str]] = {}
    for m, files in mods.items():
        for p in files:
            for name in read[p][0] & declared if p.suffix == ".c" else ():
                definers.setdefault(name, set()).add(m)
    graph: dict[str, set[str]] = {}
    for m, files in mods.items():
        deps = {Path(inc).stem for p in files for inc in _INCLUDE.findall(p.read_text(encoding="utf-8"))}
        deps |= {next(iter(definers[n])) for p in files for n in _CALL.findall(read[p][2])
                 if len(definers.get(n, ())) == 1}
        graph[m] = {d for d in deps if d != m and d in mods}
    return graph
