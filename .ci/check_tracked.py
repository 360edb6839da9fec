"""Fail when git tracks a build output: a compiled program or library (an
ELF file) or Python bytecode. They are made by `make`, never committed."""

import os
import subprocess
import sys

paths = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.decode().split("\0")
bad = []
for path in filter(os.path.isfile, paths):
    with open(path, "rb") as f:
        if f.read(4) == b"\x7fELF" or path.endswith(".pyc"):
            bad.append(path)
if bad:
    sys.exit("build outputs tracked by git (remove them and list them in .gitignore): " + " ".join(bad))
print(f"{len(paths) - 1} tracked files, no build outputs among them")
