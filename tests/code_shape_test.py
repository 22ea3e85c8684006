"""The code keeps the shape the house style asks of it (tests/STYLE.md): no
function longer than 50 lines (a codec's switch over its opcodes aside) and
under 3% of them over 40, no .cc file in apps/, lib/ or rendezvous/ over
650 lines, comments in at least 12% of the non-blank lines of each folder's
.cc files, a root README of at most 280 lines and a folder README of at
most 850. Run with --figures to print the
figures (function count, median, p90, longest; comment share by folder)."""
import json
import os
import statistics
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("apps", "lib", "rendezvous", "examples")
MAX_LINES = 50
MAX_SHARE_OVER_40 = 0.03
MAX_FILE_LINES = 650
FILE_LIMITED = ("apps", "lib", "rendezvous")
MIN_COMMENT_SHARE = 0.12
MAX_README_LINES = 280
# A folder's README is its module map and design notes, not a manual: a
# ceiling near today's largest (apps/dtrun's) keeps them from growing
# unread. The benchmark tables (tests/bench/README.md) are the one place
# figures live and grow.
MAX_FOLDER_README_LINES = 850
FIGURES_README = "tests/bench/README.md"
# One switch over every opcode of the wire protocol, each way: splitting it
# would scatter the one table a reader wants whole.
CODEC_SWITCHES = {("rendezvous/store_state.cc", "Apply"),
                  ("rendezvous/wire.cc", "EncodeRequest")}


def sources(suffixes):
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *FOLDERS],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split() if p.endswith(suffixes)
            and os.path.exists(os.path.join(ROOT, p))]


def functions():
    """(lines, path, name, first line) of every function defined."""
    ctags = next((c for c in ("ctags-universal", "ctags") if subprocess.run(
        ["sh", "-c", f"command -v {c}"], capture_output=True).returncode == 0), None)
    if ctags is None:
        raise unittest.SkipTest("universal-ctags is not installed (scripts/install-deps.sh)")
    out = subprocess.run([ctags, "--output-format=json", "--fields=+ne", "--kinds-c++=f",
                          "--language-force=c++", "-f", "-", *sources((".cc", ".h"))],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        tag = json.loads(line)
        if "end" in tag:
            found.append((tag["end"] - tag["line"] + 1, tag["path"], tag["name"], tag["line"]))
    return sorted(found)


def comment_share():
    """folder -> (comment lines, non-blank lines) of its .cc files."""
    shares = {}
    for path in sources((".cc",)):
        comments, total = shares.get(path.split("/")[0], (0, 0))
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for line in f:
                text = line.strip()
                if text:
                    total += 1
                    comments += text.startswith("//")
        shares[path.split("/")[0]] = (comments, total)
    return shares


def line_count(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return sum(1 for _ in f)


class CodeShapeTest(unittest.TestCase):
    def test_no_function_is_longer_than_50_lines(self):
        found = functions()
        long = [f"{path}:{first} {name}: {n} lines" for n, path, name, first in found
                if n > MAX_LINES and (path, name) not in CODEC_SWITCHES]
        self.assertEqual(long, [], "split these functions (tests/STYLE.md)")
        over_40 = sum(1 for f in found if f[0] > 40)
        self.assertLess(over_40 / len(found), MAX_SHARE_OVER_40,
                        f"{over_40} of {len(found)} functions are over 40 lines")

    def test_no_file_is_longer_than_650_lines(self):
        long = [f"{p}: {line_count(p)} lines" for p in sources((".cc",))
                if p.startswith(FILE_LIMITED) and line_count(p) > MAX_FILE_LINES]
        self.assertEqual(long, [], "split these files by what they do (tests/STYLE.md)")

    def test_comment_share_of_cc_files(self):
        for folder, (comments, total) in comment_share().items():
            with self.subTest(folder=folder):
                self.assertGreaterEqual(
                    comments / total, MIN_COMMENT_SHARE,
                    f"{folder}: {comments} comment lines of {total}: say why more")

    def test_readme_is_a_map_not_a_manual(self):
        n = line_count("README.md")
        self.assertLessEqual(n, MAX_README_LINES,
                             f"README.md has {n} lines: move detail to the folders' READMEs")

    def test_folder_readmes_stay_maps(self):
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*README.md"],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        long = [f"{p}: {line_count(p)} lines" for p in out.stdout.split()
                if "/" in p and p != FIGURES_README
                and line_count(p) > MAX_FOLDER_README_LINES]
        self.assertEqual(long, [], "shorten these: link to tests/bench/README.md for figures "
                                   "and to the code's headers for detail")


def figures():
    lengths = [f[0] for f in functions()]
    shares = ", ".join(f"{folder} {100 * c / t:.1f}%"
                       for folder, (c, t) in sorted(comment_share().items()))
    print(f"functions {len(lengths)}, median {statistics.median(lengths)} lines, "
          f"p90 {statistics.quantiles(lengths, n=10)[-1]:.0f}, longest {lengths[-1]}; "
          f".cc comment share: {shares}")


if __name__ == "__main__":
    if "--figures" in sys.argv:
        figures()
    else:
        unittest.main()
