#!/usr/bin/env python3
"""How src/ stands against the layout's limits: files over 700 lines,
functions over 100 (non-test code: everything before a file's test module),
import circles, between top-level modules and between files (comments
ignored; a folder's `mod.rs` re-exports are its face, not a dependency),
and type names defined more than once (one meaning per name; a journal
record's struct, made by `events!`, takes the name of what it records).

    python3 tools/measure-layout.py [SRC_DIR]
    python3 tools/measure-layout.py --check [SRC_DIR]
    python3 tools/measure-layout.py --update-doc

`--update-doc` writes these lines into docs/architecture.md (the fenced block
of "Where the layout stands"), which tests/layout.rs holds to them.

`--check` fails (exit 1) on any circle, any type name defined twice, and on any file or function over its
limit that tools/layout-allowances.txt does not list, or that grew past the
size listed there; a listed one that is now within the limit must be taken
off the list. Each line of that file: `file PATH LINES why` or
`fn NAME LINES why`, where `why` begins with `table:` (a declared pure
table or renderer) or `debt:` (to split).
"""
import collections
import os
import re
import sys

FILE_LIMIT, FN_LIMIT = 700, 100
args = [a for a in sys.argv[1:] if a not in ("--check", "--update-doc")]
check = "--check" in sys.argv[1:]
update_doc = "--update-doc" in sys.argv[1:]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(args[0] if args else os.path.join(here, "..", "src"))

files, fns = [], []
types = collections.defaultdict(list)
deps = collections.defaultdict(set)
texts = {}
for d, _, names in os.walk(root):
    for f in names:
        if not f.endswith(".rs") or f.endswith("_tests.rs") or f == "tests.rs":
            continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        text = open(p).read()
        cut = text.find("\n#[cfg(test)]\nmod ")
        body = text[:cut] if cut >= 0 else text
        files.append((body.count("\n") + 1, rel))
        texts[rel] = body
        for m in re.finditer(r"^[ \t]*(?:pub(?:\([a-z]+\))? )?(?:async )?(?:const )?fn ([a-z_0-9]+)", body, re.M):
            i, semi = body.find("{", m.end()), body.find(";", m.end())
            if i < 0 or 0 <= semi < i:
                continue
            depth, j = 0, i
            while j < len(body):
                depth += {"{": 1, "}": -1}.get(body[j], 0)
                if depth == 0:
                    break
                j += 1
            name = rel[:-3].replace("/mod", "").replace("/", "::") + "::" + m.group(1)
            fns.append((body[m.start():j].count("\n") + 1, name))
        for m in re.finditer(r"^[ \t]*(?:pub(?:\([a-z]+\))? )?(?:struct|enum|type|trait) ([A-Z][A-Za-z0-9_]*)", body, re.M):
            # An impl's associated type (`type Value = Record;` of a serde
            # Visitor) names a trait's slot, not a type of ours.
            if re.match(r"[ \t]+type ", m.group(0)) and not re.match(r"[ \t]*pub", m.group(0)):
                continue
            types[m.group(1)].append(rel)
        # The enums a `names!` block declares (`    Name {` at its top level).
        for block in re.finditer(r"^names! \{\n(.*?)^\}", body, re.M | re.S):
            for m in re.finditer(r"^    ([A-Z][A-Za-z0-9_]*) \{$", block.group(1), re.M):
                types[m.group(1)].append(rel)
        top = rel.split("/")[0].removesuffix(".rs")
        if top in ("main", "lib"):
            continue
        code = "\n".join(l for l in body.split("\n") if not l.strip().startswith("//"))
        for m in re.finditer(r"crate::([a-z_]+)", code):
            if m.group(1) != top:
                deps[top].add(m.group(1))


def circles_of(graph):
    """Strongly connected components (Tarjan) of more than one node."""
    index, low, stack, on, found, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


# Files as modules: rank/setup.rs is crate::rank::setup, rank/mod.rs crate::rank.
module_of = {}
for rel in texts:
    parts = rel[:-3].split("/")
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]):
        continue
    module_of[tuple(parts)] = rel


def resolve(path):
    """The file a path (module segments, the item last) names: its longest
    known module prefix."""
    for k in range(len(path), 0, -1):
        if tuple(path[:k]) in module_of:
            return module_of[tuple(path[:k])]
    return None


file_deps = collections.defaultdict(set)
path_re = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z_0-9]*)+)(::\{([^}]*)\})?")
for rel, body in texts.items():
    here_mod = rel[:-3].split("/")
    is_mod = here_mod[-1] == "mod"
    if is_mod:
        here_mod = here_mod[:-1]
    if here_mod in (["lib"], ["main"]):
        continue
    for line in body.split("\n"):
        s = line.strip()
        if s.startswith("//"):
            continue
        # A folder's face: `pub use child::X` in its mod.rs.
        if is_mod and re.match(r"pub(\([a-z]+\))? use ", s):
            continue
        for m in path_re.finditer(line):
            segs = [x for x in m.group(2).split("::") if x]
            base = [] if m.group(1) == "crate" else here_mod[:-1]
            while segs and segs[0] == "super":
                base, segs = base[:-1], segs[1:]
            names = [x.strip().split(" ")[0].split("::")[0] for x in (m.group(4) or "").split(",")]
            for tail in [[]] if not names or names == [""] else [[x] for x in names if x and x != "self"]:
                target = resolve(base + segs + tail)
                if target and target != rel:
                    file_deps[rel].add(target)
        # `use super::{a, b}` without a path between: the braces alone.
        for m in re.finditer(r"\bsuper::\{([^}]*)\}", line):
            for x in m.group(1).split(","):
                x = x.strip().split(" ")[0].split("::")[0]
                if x and x != "self":
                    target = resolve(here_mod[:-1] + [x])
                    if target and target != rel:
                        file_deps[rel].add(target)

files.sort(reverse=True)
fns.sort(reverse=True)
big_files = [(p, n) for n, p in files if n > FILE_LIMIT]
big_fns = [(p, n) for n, p in fns if n > FN_LIMIT]
module_circles = circles_of(deps)
file_circles = circles_of(file_deps)
twice = {t: ps for t, ps in types.items() if len(ps) > 1}
report = "\n".join([
    f"files over {FILE_LIMIT} lines: " + (", ".join(f"{p} {n}" for p, n in big_files) or "none"),
    f"functions over {FN_LIMIT} lines: " + (", ".join(f"{p} {n}" for p, n in big_fns) or "none"),
    f"import circles between modules: {module_circles or 'none'}",
    f"import circles between files: {file_circles or 'none'}",
    "type names defined more than once: "
    + (", ".join(f"{t} ({' '.join(sorted(ps))})" for t, ps in sorted(twice.items())) or "none"),
])
print(report)
if update_doc:
    doc_path = os.path.join(here, "..", "docs", "architecture.md")
    doc = open(doc_path).read()
    m = re.search(r"(whose lines are\s+these[^\n]*\n\n```\n)(.*?)(```)", doc, re.S)
    if not m:
        sys.exit(f"{doc_path}: no fenced block after `whose lines are these`")
    open(doc_path, "w").write(doc[: m.start(2)] + report + "\n" + doc[m.end(2):])

if not check:
    sys.exit(0)
allowed = {}
listing = os.path.join(here, "layout-allowances.txt")
for no, line in enumerate(open(listing), 1):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    kind, name, size, why = (line.split(None, 3) + [""])[:4]
    if kind not in ("file", "fn") or not size.isdigit() or not why.startswith(("table:", "debt:")):
        print(f"{listing}:{no}: expected `file|fn NAME LINES table:|debt: why`, got {line!r}")
        sys.exit(1)
    allowed[(kind, name)] = int(size)
problems = []
for c in module_circles + file_circles:
    problems.append(f"import circle: {' <-> '.join(c)}")
for t, ps in sorted(twice.items()):
    problems.append(f"type name {t} defined in {', '.join(sorted(ps))}: one meaning per name")
for kind, found in (("file", big_files), ("fn", big_fns)):
    for name, n in found:
        cap = allowed.pop((kind, name), None)
        if cap is None:
            problems.append(f"{kind} {name}: {n} lines, over the limit and not in {os.path.basename(listing)}")
        elif n > cap:
            problems.append(f"{kind} {name}: {n} lines, grew past the {cap} listed")
for (kind, name), cap in allowed.items():
    problems.append(f"{kind} {name}: within the limit now (or gone): take it off {os.path.basename(listing)}")
for p in problems:
    print("layout:", p)
debts = sum(1 for line in open(listing) if " debt:" in line)
print(f"layout: {len(problems)} problem(s); {debts} listed debt(s)")
sys.exit(1 if problems else 0)
