"""The release path: the version is written once (the Go constant, which
setup.py gives the package) and CHANGELOG.md's newest release names it; a
tag releases only that version, once its section is dated; and CI publishes
the wheels and the sdist of a version tag, by trusted publishing, only after
the tests passed."""

import importlib.util
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _check_release():
    spec = importlib.util.spec_from_file_location("check_release", os.path.join(ROOT, ".ci", "check_release.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _check_release()
VERSION = check.package_version()


def test_the_version_is_the_go_constant_and_the_changelogs():
    go = [
        m.group(1)
        for dirpath, _, files in os.walk(os.path.join(ROOT, "go"))
        if "version.go" in files
        for m in [re.search(r'const Version = "([^"]+)"', open(os.path.join(dirpath, "version.go")).read())]
        if m
    ]
    assert go == [VERSION], "one Go constant, which setup.py reads"
    assert check.problems() == []


def test_the_changelog_keeps_a_changelog():
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        text = f.read()
    assert text.startswith("# Changelog\n")
    releases = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert releases and releases[-1] == "0.1.0", "it starts at 0.1.0"
    assert set(re.findall(r"^### (.+)$", text, re.M)) <= {
        "Added",
        "Changed",
        "Deprecated",
        "Removed",
        "Fixed",
        "Security",
    }
    for release in releases:
        if release != "Unreleased":
            assert f"\n[{release}]: " in text, f"{release} has its link at the end"


@pytest.mark.parametrize(
    "heading,tag,wrong",
    [
        (f"## [{VERSION}] - 2026-12-01", f"v{VERSION}", []),
        (f"## [{VERSION}] - Unreleased", None, []),
        (f"## [{VERSION}] - Unreleased", f"v{VERSION}", ["no release date"]),
        (f"## [{VERSION}] - 2026-12-01", "v99.0.0", ["does not release"]),
        ("## [99.0.0] - 2026-12-01", f"v{VERSION}", ["newest release is 99.0.0"]),
    ],
)
@pytest.mark.slow
def test_a_tag_releases_the_version_whose_section_is_dated(tmp_path, heading, tag, wrong):
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(f"# Changelog\n\n## [Unreleased]\n\n### Added\n\n- more\n\n{heading}\n\n### Added\n\n- all\n")
    found = check.problems(tag, str(changelog))
    assert len(found) == len(wrong) and all(w in f for w, f in zip(wrong, found, strict=True)), found


def test_ci_publishes_a_version_tag_after_the_tests():
    with open(os.path.join(ROOT, ".github", "workflows", "ci.yml")) as f:
        ci = yaml.safe_load(f)
    jobs = ci["jobs"]
    publish = jobs["publish"]
    assert set(publish["needs"]) == {"test", "wheels", "sdist"}
    assert "refs/tags/v" in publish["if"]
    assert publish["permissions"]["id-token"] == "write"
    steps = publish["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert uses[-1].startswith("pypa/gh-action-pypi-publish@"), "it publishes last"
    runs = " ".join(s.get("run", "") for s in steps)
    assert ".ci/check_release.py" in runs and "GITHUB_REF_NAME" in runs
    assert "pypa/cibuildwheel" in str(jobs["wheels"]) and "--sdist" in str(jobs["sdist"])
