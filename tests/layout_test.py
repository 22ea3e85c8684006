"""README's Layout table is the module map: every source file under apps/,
lib/ and rendezvous/ must be named there (as `name.h/.cc`, `name.cc`, or a
folder row such as `python/dtrun/`), and every file it names must exist."""
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = (".h", ".cc", ".py", ".cmake")


def layout_rows():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
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
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "apps", "lib",
                          "rendezvous"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split() if p.endswith(SOURCES) and "__pycache__" not in p]


class LayoutTest(unittest.TestCase):
    def test_every_source_file_is_in_the_layout_table(self):
        named = named_paths(layout_rows())
        missing = [p for p in tracked_sources()
                   if p not in named and not any(p.startswith(n) for n in named if n.endswith("/"))]
        self.assertEqual(missing, [], "add these to README's Layout table")

    def test_every_file_the_table_names_exists(self):
        gone = [p for p in named_paths(layout_rows())
                if p.startswith(("apps", "lib", "rendezvous"))
                and not os.path.exists(os.path.join(ROOT, p))]
        self.assertEqual(gone, [], "README's Layout table names files that do not exist")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
