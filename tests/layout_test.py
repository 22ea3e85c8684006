"""The Layout tables are the module map: each folder's README has one (the
root README's points at them), every source file under apps/, lib/,
rendezvous/ and examples/ must be named in one (as `name.h/.cc`, `name.cc`,
or a folder row such as `python/dtrun/`), and every file they name must
exist."""
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = (".h", ".cc", ".py", ".cmake")
FOLDERS = ("apps", "lib", "rendezvous", "examples")


def readmes():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "README.md",
                          "*/README.md"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    return [p for p in out.stdout.split() if not p.startswith("build")]


def layout_rows():
    """(folder, [names]) of every Layout table's rows, in every README."""
    rows = []
    for readme in readmes():
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            text = f.read()
        if "\n## Layout\n" not in text:
            continue
        section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and cells[0] not in ("folder", "---"):
                rows.append((cells[0], re.findall(r"`([^`]+)`", cells[1])))
    return rows


def named_paths(rows):
    """(folder, name) -> set of repository paths the table names."""
    paths = set()
    for folder, names in rows:
        for name in names:
            if name.endswith("/"):
                paths.add(os.path.join(folder, name))
                continue
            stem, _, exts = name.partition(".")
            for ext in exts.split("/") if exts else [""]:
                ext = ext.lstrip(".")
                paths.add(os.path.join(folder, stem + ("." + ext if ext else "")))
    return paths


def tracked_sources():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *FOLDERS],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split() if p.endswith(SOURCES) and "__pycache__" not in p]


class LayoutTest(unittest.TestCase):
    def test_every_source_file_is_in_the_layout_table(self):
        named = named_paths(layout_rows())
        missing = [p for p in tracked_sources()
                   if p not in named and not any(p.startswith(n) for n in named if n.endswith("/"))]
        self.assertEqual(missing, [], "add these to their folder README's Layout table")

    def test_every_file_the_table_names_exists(self):
        gone = [p for p in named_paths(layout_rows())
                if p.startswith(FOLDERS)
                and not os.path.exists(os.path.join(ROOT, p))]
        self.assertEqual(gone, [], "a Layout table names files that do not exist")

    def test_every_folder_readme_has_a_layout_table(self):
        for readme in ("rendezvous/README.md", "apps/dtrun/README.md", "lib/README.md",
                       "examples/README.md", "tests/README.md", "scripts/README.md"):
            with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
                self.assertIn("\n## Layout\n", f.read(), readme)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
