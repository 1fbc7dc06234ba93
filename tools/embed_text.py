"""Writes a C++ source that defines `const char <symbol>[]` holding a text file.

Used by the build to ship data files inside a binary (the planner's machine
profile) without a second copy in the sources: the file stays the one to edit.
usage: embed_text.py SYMBOL NAMESPACE INPUT OUTPUT
"""
import sys

symbol, namespace, src, out = sys.argv[1:5]
data = open(src, "rb").read()
body = ",".join(str(b) for b in data)
with open(out, "w") as f:
    f.write(f"// Generated from {src} by tools/embed_text.py: edit that file.\n")
    f.write(f"namespace {namespace} {{\nextern const char {symbol}[];\n")
    f.write(f"const char {symbol}[] = {{{body}{',' if body else ''}0}};\n}}\n")
