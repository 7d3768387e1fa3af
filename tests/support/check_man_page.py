#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# check_man_page.py LAPSE_BINARY SOURCE_DIR GROFF: docs/lapse.1 is what `lapse help --man`
# prints now (scripts/readme-options rewrites both it and the README's reference), and
# groff renders it with every warning on (-ww) and says nothing.
import pathlib
import subprocess
import sys

lapse, root, groff = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
page = subprocess.run([lapse, "help", "--man"], check=True, capture_output=True).stdout
committed = (root / "docs" / "lapse.1").read_bytes()
failed = False
if page != committed:
    print("docs/lapse.1 differs from `lapse help --man`; run scripts/readme-options")
    failed = True
render = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z"], input=page,
                        capture_output=True)
if render.returncode != 0 or render.stderr:
    print("groff -man -ww warns about the man page:\n" + render.stderr.decode())
    failed = True
# Plain text (grotty -c -b -u: no overstriking), to find the sections in.
text = subprocess.run([groff, "-man", "-Tutf8", "-P-cbu"], input=page, check=True,
                      capture_output=True).stdout.decode()
for heading in ("NAME", "SYNOPSIS", "COMMANDS", "OPTIONS", "ENVIRONMENT", "EXIT STATUS"):
    if "\n" + heading + "\n" not in text:
        print("the rendered page has no " + heading + " section")
        failed = True
if failed:
    sys.exit(1)
print("docs/lapse.1 is `lapse help --man`, and groff renders it without a warning")
