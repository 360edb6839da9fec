"""The version is one: the Go constant version.Version, which setup.py gives
the package (python setup.py --version), is the newest release CHANGELOG.md
names; and a release tag is v and that version, whose section carries the
date it was released.

    python .ci/check_release.py           # the version's places agree
    python .ci/check_release.py v0.1.0    # and this tag releases it (CI, before publishing)
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHANGELOG = os.path.join(ROOT, "CHANGELOG.md")

#: A release's heading: "## [0.1.0] - 2026-12-01", or "- Unreleased" until it is.
RELEASE = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+[^\]]*)\](?: - (?P<date>\S+))?\s*$", re.M)


def package_version():
    """The version setup.py builds the package with (it reads the Go constant)."""
    out = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return out.strip().splitlines()[-1]


def changelog_release(path=CHANGELOG):
    """The newest release CHANGELOG.md names (the [Unreleased] section, if
    any, above it is not one): (version, date or "Unreleased")."""
    with open(path) as f:
        m = RELEASE.search(f.read())
    if m is None:
        raise SystemExit(f"{path} names no release (a heading such as '## [0.1.0] - 2026-12-01')")
    return m.group("version"), m.group("date") or ""


def problems(tag=None, changelog=CHANGELOG):
    """What is wrong with the version's places, and with releasing tag."""
    version = package_version()
    released, date = changelog_release(changelog)
    out = []
    if released != version:
        out.append(f"CHANGELOG.md's newest release is {released}, but the package's version is {version}")
    if tag is not None:
        if tag != f"v{version}":
            out.append(f"the tag {tag} does not release the package's version {version} (tag v{version})")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            out.append(f"CHANGELOG.md's section for {released} has no release date (it says {date or 'nothing'!r})")
    return out


def main(argv):
    found = problems(argv[0] if argv else None)
    if found:
        sys.exit("\n".join(found))
    print(f"version {package_version()}: setup.py, the Go constant and CHANGELOG.md agree")


if __name__ == "__main__":
    main(sys.argv[1:])
