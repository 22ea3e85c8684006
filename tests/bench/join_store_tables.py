"""Joins store_bench's tables from two builds (libtorch 1.13 on the host, 2.6
in the root of scripts/torch2.sh) into the one table tests/bench/README.md carries: each
row's dtstore and torch server figures under both clients, and both ratios.

Usage: join_store_tables.py TABLE_1_13 TABLE_2_6
"""
import sys


def rows(path):
    """{measurement: (dtstore, torch server, unit, ratio)} and the header's client."""
    out, client = {}, None
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 5:
                continue
            if cells[0].startswith("measurement"):
                client = cells[0][cells[0].find("(") + 1:cells[0].find(")")]
                server = cells[2]
            elif not cells[0].startswith("---"):
                out[cells[0]] = cells[1:]
    if client is None:
        sys.exit(f"{path}: no store_bench table in it")
    return out, client, server


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, old_client, old_server = rows(sys.argv[1])
    new, new_client, new_server = rows(sys.argv[2])
    print(f"| measurement | dtstore ({old_client}) | {old_server} | dtstore ({new_client}) "
          f"| {new_server} | unit | ours vs {old_server} | ours vs {new_server} |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for what, (ours, theirs, unit, r) in old.items():
        ours2, theirs2, _, r2 = new.get(what, ["", "", "", ""])
        print(f"| {what} | {ours} | {theirs} | {ours2} | {theirs2} | {unit} | {r} | {r2} |")
    for what in new.keys() - old.keys():
        ours2, theirs2, unit, r2 = new[what]
        print(f"| {what} | | | {ours2} | {theirs2} | {unit} | | {r2} |")


if __name__ == "__main__":
    main()
