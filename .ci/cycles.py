#!/usr/bin/env python3
"""Fails on an import cycle between the source files of a crate.

The layering rule (src/alloc/README.md): each file depends only on files
listed before it, so the files of a crate form a directed acyclic graph.
This script builds that graph for every crate root named on the command
line (default: the workspace's: src/lib.rs, jobs/src/lib.rs,
jobs/src/main.rs, alloc-shim/src/lib.rs), reports every cycle it finds
(the files in order, the first one repeated at the end) and exits 1; 0
when there is none. Python 3 standard library only.

What is a node: one source file (a module declared with `mod x;`, found as
x.rs or x/mod.rs, or where `#[path = ".."]` says). Inline modules
(`mod tests { .. }`) belong to their file.

What is an edge A -> B: code in file A names an item that file B defines.
Names are found in the code, with comments and string literals removed:

- the paths of `use` declarations (braces expanded), and
- qualified paths in the code: `crate::..`, `super::..`, `self::..`, and
  paths that start with a child module's name or with a name imported by
  a `use` (`use crate::alloc; alloc::purge()` names `purge`).

A path is resolved through the module tree to the file that defines the
item: `crate::Result` is re-exported by lib.rs (`pub use error::Result`),
so it names error.rs, not lib.rs. Every `use` of a module counts as a
re-export for this (Rust lets child modules see their parent's private
imports). An item not found among a module's imports is taken to be
defined in that module's file. A path that ends at a module (`use
crate::alloc;`) names no item: the edge comes from what is used through
it. Paths into other crates (std, outcore from jobs) are not edges.

What is not an edge:

- a module declaration (`mod x;`);
- anything a file names in one of its own descendant files (a parent's
  file is the root of its subtree: it declares its children, re-exports
  their items and may call them, and its children may use what it
  defines). A child's use of its parent's items (`super::Runtime`) is an
  edge like any other, so a cycle through a parent and a file outside its
  subtree is still found;
- a file naming an item of its own.

`--dot` prints the graph instead (Graphviz).
"""

import os
import re
import sys

ROOTS = ["src/lib.rs", "jobs/src/lib.rs", "jobs/src/main.rs", "alloc-shim/src/lib.rs"]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# The start of a raw string (its hashes in group 1) or of a byte string.
RAW_OR_BYTES = re.compile(r'b?r(#*)"|b"')


def strip(src):
    """The source with comments, string and char literals blanked out
    (line breaks kept, so positions stay meaningful)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c in "rb" and not (i and (src[i - 1].isalnum() or src[i - 1] == "_")) and RAW_OR_BYTES.match(src, i):
            m = RAW_OR_BYTES.match(src, i)
            if m.group(1) is not None:  # r"..", r#".."#, br".."
                end = '"' + m.group(1)
                j = src.find(end, m.end())
                j = n if j < 0 else j + len(end)
            else:  # b".."
                j = skip_string(src, m.end() - 1)
            out.append(" " + "\n" * src.count("\n", i, j))
            i = j
        elif c == '"':
            j = skip_string(src, i)
            out.append(" " + "\n" * src.count("\n", i, j))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", src[i:])
            if m:
                out.append(" ")
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def skip_string(src, i):
    """The index after the string literal that starts at src[i] == '"'."""
    i += 1
    while i < len(src):
        if src[i] == "\\":
            i += 2
        elif src[i] == '"':
            return i + 1
        else:
            i += 1
    return i


def expand_use(tree):
    """`a::{b, c::{d, e as f}, self}` -> [(["a","b"], "b"), ...]: each full
    path and the name it binds ("*" for a glob)."""
    tree = re.sub(r"\s+as\s+", "@", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, t):
        for p in split_top(t):
            if not p:
                continue
            k = p.find("{")
            if k >= 0:
                head = [s for s in p[:k].split("::") if s]
                walk(prefix + head, p[k + 1:-1])
                continue
            p, _, alias = p.partition("@")
            segs = [s for s in p.split("::") if s]
            if segs == ["self"]:
                path = prefix
            else:
                path = prefix + segs
            if not path:
                continue
            name = alias or path[-1]
            out.append((path, "*" if name == "*" else name))

    walk([], tree)
    return out


def split_top(t):
    parts, depth, cur = [], 0, []
    for c in t:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


class Module:
    def __init__(self, path, file, parent):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.parent = parent
        self.children = {}  # name -> Module
        self.imports = {}  # bound name -> full path (list of segments)
        self.globs = []
        self.inline_code = None
        # The graph's node: the file, or `file::name` for an inline module.
        self.node = file if parent is None or parent.file != file else parent.node + "::" + path[-1]


class Crate:
    def __init__(self, root_file):
        self.root = Module((), root_file, None)
        self.files = {}  # file -> (stripped code, [inline module ranges])
        self.modules = []
        self.load(self.root)
        for m in self.modules:
            self.read_imports(m)

    def load(self, mod):
        self.modules.append(mod)
        if mod.file not in self.files:
            with open(mod.file, encoding="utf-8") as f:
                self.files[mod.file] = strip(f.read())
        code = self.files[mod.file]
        base = os.path.dirname(mod.file)
        stem = os.path.basename(mod.file)
        if stem not in ("lib.rs", "main.rs", "mod.rs"):
            base = os.path.join(base, stem[:-3])
        skip_to = 0
        paths = self.path_attrs(mod.file)
        for m in re.finditer(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])", code):
            if m.start() < skip_to:
                continue
            name, kind = m.group(1), m.group(2)
            if kind == "{":
                skip_to = match_brace(code, m.end() - 1)
                child = Module(mod.path + (name,), mod.file, mod)
                child.inline_code = code[m.end():skip_to - 1]
                mod.children[name] = child
                self.modules.append(child)
                self.load_inline(child)
                continue
            if name in paths:
                f = os.path.normpath(os.path.join(os.path.dirname(mod.file), paths[name]))
            else:
                f = os.path.join(base, name + ".rs")
                if not os.path.exists(f):
                    f = os.path.join(base, name, "mod.rs")
            if not os.path.exists(f):
                continue
            child = Module(mod.path + (name,), os.path.normpath(f), mod)
            mod.children[name] = child
            self.load(child)

    def load_inline(self, mod):
        code = mod.inline_code
        for m in re.finditer(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*\{", code):
            child = Module(mod.path + (m.group(1),), mod.file, mod)
            child.inline_code = code[m.end():match_brace(code, m.end() - 1) - 1]
            mod.children[m.group(1)] = child
            self.modules.append(child)

    @staticmethod
    def path_attrs(file):
        """{module name: the file its `#[path = ".."]` attribute names}
        (read from the raw text: the stripped code has no strings)."""
        with open(file, encoding="utf-8") as f:
            raw = f.read()
        attr = r'#\[path\s*=\s*"([^"]*)"\]((?:\s*#\[[^\]]*\])*)\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(' + IDENT + r")\s*;"
        return {m.group(3): m.group(1) for m in re.finditer(attr, raw)}

    def own_code(self, mod):
        """The module's code, without its inline child modules' bodies."""
        code = mod.inline_code
        if code is None:
            code = self.files[mod.file]
        out, i = [], 0
        for m in re.finditer(r"\bmod\s+" + IDENT + r"\s*\{", code):
            if m.start() < i:
                continue
            end = match_brace(code, m.end() - 1)
            out.append(code[i:m.end()])
            out.append("\n" * code.count("\n", m.end(), end))
            i = end
        out.append(code[i:])
        return "".join(out)

    def read_imports(self, mod):
        mod.uses = []
        for m in re.finditer(r"\buse\s+([^;]*);", self.own_code(mod)):
            for path, name in expand_use(m.group(1)):
                path = [s for s in path if s != "::"]
                if path and path[0] == "":
                    path = path[1:]
                mod.uses.append(path)
                if name == "*":
                    mod.globs.append(path[:-1])
                elif name != "self":
                    mod.imports[name] = path

    def start(self, mod, first):
        """The module a path's first segment stands for, if it is one, and
        whether the path is within the crate."""
        if first == "crate":
            return self.root
        if first == "self":
            return mod
        if first == "super":
            return mod.parent
        if first in mod.children:
            return mod.children[first]
        return None

    def resolve(self, mod, path, depth=0):
        """The file that defines what `path` (seen from `mod`) names, or
        None (another crate, a module, or not found)."""
        if depth > 20 or not path:
            return None
        cur = self.start(mod, path[0])
        rest = path[1:]
        if cur is None:
            # A name imported by `use` (its path is seen from `mod`), or
            # another crate.
            target = mod.imports.get(path[0])
            if target is None or target[0] == path[0]:
                return None
            return self.resolve(mod, target + rest, depth + 1)
        while rest and rest[0] == "super" and cur is not None:
            cur, rest = cur.parent, rest[1:]
        if cur is None:
            return None
        while rest:
            s = rest[0]
            if s in cur.children:
                cur, rest = cur.children[s], rest[1:]
                continue
            if s in cur.imports:
                return self.resolve(cur, cur.imports[s] + rest[1:], depth + 1)
            return cur.node
        return None  # a module: names no item

    def edges(self):
        """{file: {file: [an example path]}}."""
        out = {}
        for mod in self.modules:
            code = self.own_code(mod)
            paths = list(mod.uses)
            no_use = re.sub(r"\buse\s+[^;]*;", lambda m: "\n" * m.group(0).count("\n"), code)
            heads = set(mod.children) | set(mod.imports) | {"crate", "super", "self"}
            for m in re.finditer(r"(?<![\w:])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)", no_use):
                if m.group(1) not in heads:
                    continue
                segs = [m.group(1)] + [s for s in re.split(r"\s*::\s*", m.group(2)) if s]
                paths.append(segs)
            for p in paths:
                f = self.resolve(mod, p)
                if f is None or f == mod.node or f in self.below(mod):
                    continue
                out.setdefault(mod.node, {}).setdefault(f, "::".join(p))
        return out

    @staticmethod
    def below(mod):
        """The nodes of the modules under `mod`."""
        out, stack = set(), list(mod.children.values())
        while stack:
            c = stack.pop()
            out.add(c.node)
            stack.extend(c.children.values())
        return out


def match_brace(code, i):
    """The index after the brace that closes the one at code[i]."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def cycles(graph):
    """The strongly connected components with more than one file, each as
    one cycle through some of its files (Tarjan, iterative)."""
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]
    nodes = set(graph) | {b for a in graph for b in graph[a]}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    return [(one_cycle(graph, c), c) for c in sorted(sccs)]


def one_cycle(graph, comp):
    """A shortest cycle through comp[0] inside the component."""
    inside = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, {})):
            if w not in inside:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main(argv):
    dot = "--dot" in argv
    roots = [a for a in argv if not a.startswith("--")] or ROOTS
    found = 0
    for root in roots:
        crate = Crate(root)
        graph = crate.edges()
        if dot:
            print("digraph %s {" % re.sub(r"\W", "_", root))
            for a in sorted(graph):
                for b in sorted(graph[a]):
                    print('  "%s" -> "%s";' % (a, b))
            print("}")
            continue
        for cyc, comp in cycles(graph):
            found += 1
            print("cycle in %s:" % root)
            for a, b in zip(cyc, cyc[1:]):
                print("  %s -> %s   (%s)" % (a, b, graph[a][b]))
            if len(comp) > len(cyc) - 1:
                print("  (and more cycles among: %s)" % ", ".join(comp))
    if found:
        print("cycles.py: %d import cycle(s): move what both files need to where it belongs"
              " (what counts as a dependency: .ci/cycles.py's docstring)" % found, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
