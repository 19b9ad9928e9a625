#!/usr/bin/env python3
"""How src/ stands against issue 12's aims: files over 700 lines, functions
over 100 (non-test code: everything before a file's test module), and import
circles between top-level modules (comments ignored).

    python3 tools/measure-layout.py [SRC_DIR]
"""
import collections
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
root = os.path.normpath(root)
files, fns = [], []
deps = collections.defaultdict(set)
for d, _, names in os.walk(root):
    for f in names:
        if not f.endswith(".rs") or f.endswith("_tests.rs"):
            continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        text = open(p).read()
        cut = text.find("\n#[cfg(test)]\nmod ")
        body = text[:cut] if cut >= 0 else text
        files.append((body.count("\n") + 1, rel))
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
        top = rel.split("/")[0].removesuffix(".rs")
        if top in ("main", "lib"):
            continue
        code = "\n".join(l for l in body.split("\n") if not l.strip().startswith("//"))
        for m in re.finditer(r"crate::([a-z_]+)", code):
            if m.group(1) != top:
                deps[top].add(m.group(1))

# Strongly connected components (Tarjan): each of more than one module is a circle.
index, low, stack, on, circles, n = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in deps.get(v, ()):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            circles.append(sorted(comp))
for v in list(deps):
    if v not in index:
        visit(v)

files.sort(reverse=True)
fns.sort(reverse=True)
print("files over 700 lines:", ", ".join(f"{p} {n}" for n, p in files if n > 700) or "none")
print("functions over 100 lines:", ", ".join(f"{p} {n}" for n, p in fns if n > 100) or "none")
print("import circles:", circles or "none")
