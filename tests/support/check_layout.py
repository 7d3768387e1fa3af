#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# check_layout.py SOURCE_DIR: README.md's Layout section names every source file of src/
# and src/cli/ (cmd_*.c as one pattern), so the map a reader follows stays true.
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
layout = readme[readme.index("## Layout"):]
missing = []
for path in sorted(list((root / "src").glob("*.c")) + list((root / "src" / "cli").glob("*.c"))):
    name = path.name
    if name.startswith("cmd_") and "cmd_*.c" in layout:
        continue
    if not re.search(r"(?<![\w.])" + re.escape(name) + r"(?![\w])", layout):
        missing.append(str(path.relative_to(root)))
for header in sorted((root / "include" / "lapse").glob("*.h")):
    if header.name not in layout:
        missing.append(str(header.relative_to(root)))
if missing:
    print("README.md's Layout does not name: " + ", ".join(missing))
    sys.exit(1)
print("README.md's Layout names every source file")
