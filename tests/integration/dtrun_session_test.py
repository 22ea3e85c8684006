"""The console's Session reading what the workers and dtrun publish in the
store, against a real torch TCPStore in this process (no dtrun, no workers):
records, results and streamed output read while dtrun clears the store for a
new attempt.

dtrun clears the workers' store when it restarts the group. A record whose
"has" counter was read just before the clear reads back empty just after it
(torch's get WAITs for the key, which still existed, then GETs it, which no
longer does); the console must take that as "not published yet" and go on
waiting, not fail with a JSON error."""
import json
import os
import sys
import unittest
from datetime import timedelta

import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "apps", "dtrun", "python"))

from dtrun import session  # noqa: E402


def status(rank, attempt):
    return json.dumps({"attempt": attempt, "host": "h", "addr": None, "pid": 100 + rank})


class RecordsReadDuringAClear(unittest.TestCase):
    def setUp(self):
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), False)
        self.s = session.Session("127.0.0.1", self.store.port, 2)

    def test_an_empty_status_is_a_rank_not_yet_published(self):
        for r in range(2):
            self.store.add(session.has_status_key(r), 1)
        self.store.set(session.status_key(0), status(0, 1))
        self.store.set(session.status_key(1), b"")  # cleared between the reads
        self.assertEqual(list(self.s.statuses()), [0])
        self.store.add(session.READY, 2)
        self.assertFalse(self.s._ready(None))  # waits on for rank 1
        self.store.set(session.status_key(1), status(1, 1))
        self.assertEqual(sorted(self.s.statuses()), [0, 1])
        self.assertTrue(self.s._ready(None))
        self.assertEqual(self.s.workers[1], ("h", None, 101))

    def test_an_empty_result_is_a_restart_not_a_result(self):
        # Cell 0's results both came; then a worker died and dtrun cleared
        # the store (rank 1's reads back empty) and started attempt 2.
        self.s.attempt = 1
        self.store.set(session.result_key(0, 0), json.dumps({"out": "0\n"}))
        self.store.set(session.result_key(0, 1), b"")
        for r in range(2):
            self.store.add(session.has_status_key(r), 1)
            self.store.set(session.status_key(r), status(r, 2))
        self.store.add(session.READY, 2)
        results = self.s.collect(0, [0, 1])
        self.assertEqual(set(results), {0, 1})
        for res in results.values():
            self.assertTrue(res["restarted"])
            self.assertFalse(res["died"])
        self.assertEqual(self.s.attempt, 2)

    def test_streamed_output_stops_at_an_empty_record(self):
        self.store.add(session.stream_count_key(0, 0), 2)
        self.store.set(session.stream_key(0, 0, 0), json.dumps(["out", "a\n"]))
        self.store.set(session.stream_key(0, 0, 1), b"")  # cleared
        got, shown = [], {0: 0}
        self.s._pump(0, [0], shown, lambda r, which, text: got.append((r, which, text)))
        self.assertEqual(got, [(0, "out", "a\n")])
        self.assertEqual(shown, {0: 1})

    def test_an_empty_crash_record_is_no_crash_yet(self):
        self.store.add("dtrun/crash_count", 1)
        self.store.set("dtrun/crash", b"")
        self.assertIsNone(self.s.last_crash())
        self.store.set("dtrun/crash", json.dumps({"attempt": 0, "rank": 1, "how": "exit code 3"}))
        self.assertEqual(self.s.last_crash()["rank"], 1)


if __name__ == "__main__":
    unittest.main()
