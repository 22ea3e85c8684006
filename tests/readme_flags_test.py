"""README's flag table is dtrun's: every flag `dtrun --help` prints is a row
of the table under "## The command line", and every flag there is one
`--help` prints (dashed spellings; -h/--help aside).
Usage: readme_flags_test.py DTRUN"""
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTRUN = None


def readme_flags():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## The command line\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| group | flag | default | meaning |", 1)[1].split("\n\n", 1)[0]
    flags = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2:
            flags.update(re.findall(r"`(-{1,2}[a-z][a-z0-9-]*)`", cells[1]))
    return flags


def help_flags():
    out = subprocess.run([DTRUN, "--help"], capture_output=True, text=True, check=True).stdout
    flags = set()
    for line in out.splitlines():
        m = re.match(r"^  (-[^ ]+)", line)
        if m:
            flags.update(f for f in m.group(1).split(",") if "_" not in f)
    return flags - {"-h", "--help"}


class ReadmeFlagTable(unittest.TestCase):
    def test_table_equals_help(self):
        table, helped = readme_flags(), help_flags()
        self.assertEqual(sorted(helped - table), [], "in --help, missing from README's table")
        self.assertEqual(sorted(table - helped), [], "in README's table, not in --help")


if __name__ == "__main__":
    DTRUN = sys.argv.pop(1)
    unittest.main()
