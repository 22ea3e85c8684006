"""The code keeps the shape the house style asks of it: no function longer
than 60 lines (a codec's switch over its opcodes aside), and comments in at
least 12% of the non-blank lines of the .cc files. Run with --figures to
print the figures (function count, median, p90, longest; comment share)."""
import json
import os
import statistics
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("apps", "lib", "rendezvous")
MAX_LINES = 60
MIN_COMMENT_SHARE = 0.12
# One switch over every opcode of the wire protocol: splitting it would
# scatter the one table a reader wants whole.
CODEC_SWITCHES = {("rendezvous/store_state.cc", "Apply")}


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
    comments = total = 0
    for path in sources((".cc",)):
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            for line in f:
                text = line.strip()
                if text:
                    total += 1
                    comments += text.startswith("//")
    return comments, total


class CodeShapeTest(unittest.TestCase):
    def test_no_function_is_longer_than_60_lines(self):
        long = [f"{path}:{first} {name}: {n} lines" for n, path, name, first in functions()
                if n > MAX_LINES and (path, name) not in CODEC_SWITCHES]
        self.assertEqual(long, [], "split these functions (STYLE.md)")

    def test_comment_share_of_cc_files(self):
        comments, total = comment_share()
        self.assertGreaterEqual(comments / total, MIN_COMMENT_SHARE,
                                f"{comments} comment lines of {total}: say why more")


def figures():
    lengths = [f[0] for f in functions()]
    comments, total = comment_share()
    print(f"functions {len(lengths)}, median {statistics.median(lengths)} lines, "
          f"p90 {statistics.quantiles(lengths, n=10)[-1]:.0f}, longest {lengths[-1]}; "
          f".cc comment share {100 * comments / total:.1f}% ({comments} of {total})")


if __name__ == "__main__":
    if "--figures" in sys.argv:
        figures()
    else:
        unittest.main()
