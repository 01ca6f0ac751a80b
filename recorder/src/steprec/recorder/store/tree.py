"""Each run's place in the run forest, kept at ingest, so that "every run below R" is a filter, not a walk.

`run_ancestry` holds a row (ancestor_run_id, run_id, depth, relation, run_seq) for every run and each
run above it within HOP_LIMIT links, at its least distance: the links are a delegate under the run
whose tool started it (`parent_run_id`, relation `child`) and a fork under its origin
(`forked_from_run_id`, relation `fork`), and `relation` is the kind of the last link on a shortest
way down (`child` where both kinds tie). A run is not stored as its own ancestor. An ancestor need
not be a recorded run: a parent that has not arrived (or never will) has rows all the same, so its
descendants are found as the walk over the links found them. A run below is always a recorded run
(links come from `runs` rows), and `run_seq` is the `write_seq` of its row: reading a tree joins `runs`
on that integer rather than on the run id (a third less time for 100,000 runs, measured).

A run's links are fixed when it is registered, but its ancestry is not: a parent may arrive after
its children (records from different processes come in any order). So the applier adds each
batch's new runs with `link`: for every new link S -> X, each run at or above S gets each run at
or below X, at the sum of the distances, where that is shorter than what is stored. Repeated until
nothing changes, this also joins chains of new runs within one batch and the subtree of a late
parent; only rows that changed in one round are followed in the next, so a batch whose runs'
parents are all stored already takes one round. Cycles (a stranger can send parent links in a
ring) end it too: a distance only ever shrinks, and none is kept beyond HOP_LIMIT.

HOP_LIMIT bounds what a run costs: at most that many ancestors per link above it, however deep a
chain or long a cycle a stranger builds. Deeper descendants are found by `deeper_descendants`,
from the runs exactly HOP_LIMIT below, HOP_LIMIT levels per lookup; a tree shallower than that
(every tree an agent makes in practice) is read with one lookup.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

HOP_LIMIT = 32
MAX_TREE_DEPTH = 10_000
"""Descendants deeper than this are not listed (the bound the walk over the links had)."""

TABLE = """
    CREATE TABLE run_ancestry (
        ancestor_run_id VARCHAR NOT NULL,
        run_id VARCHAR NOT NULL,
        depth INTEGER NOT NULL,
        relation VARCHAR NOT NULL,
        run_seq BIGINT NOT NULL
    )
"""

LINKS = (
    "SELECT parent_run_id AS from_run_id, run_id, 'child' AS relation, write_seq AS run_seq FROM {runs}"
    " WHERE parent_run_id IS NOT NULL"
    " UNION ALL SELECT forked_from_run_id, run_id, 'fork', write_seq FROM {runs} WHERE forked_from_run_id IS NOT NULL"
)
"""Every link of the runs in `{runs}`: from the run above to the run below (and the `write_seq` of its row)."""

# Around each link S -> X to follow: the runs at or above S (S itself at 0) and the runs at or below X
# (X at 0), paired at the sum of their distances plus one; per pair the least, `child` first on a tie.
_CANDIDATES = f"""
    WITH above AS (
        SELECT from_run_id AS s, run_id AS x, relation, from_run_id AS a, 0 AS d FROM links
        UNION ALL
        SELECT l.from_run_id, l.run_id, l.relation, c.ancestor_run_id, c.depth
        FROM links l JOIN run_ancestry c ON c.run_id = l.from_run_id WHERE c.depth < {HOP_LIMIT}
    ), tops AS (SELECT DISTINCT run_id AS x, run_seq AS x_seq FROM links), below AS (
        SELECT x, x AS y, x_seq AS y_seq, 0 AS d, NULL AS relation FROM tops
        UNION ALL
        SELECT t.x, c.run_id, c.run_seq, c.depth, c.relation FROM tops t JOIN run_ancestry c ON c.ancestor_run_id = t.x
        WHERE c.depth < {HOP_LIMIT}
    ), paired AS (
        SELECT u.a AS ancestor_run_id, b.y AS run_id, u.d + 1 + b.d AS depth,
               coalesce(b.relation, u.relation) AS relation, b.y_seq AS run_seq
        FROM above u JOIN below b ON b.x = u.x
        WHERE u.a <> b.y AND u.d + 1 + b.d <= {HOP_LIMIT}
    )
    SELECT ancestor_run_id, run_id, min(depth)::INTEGER AS depth, arg_min(relation, (depth, relation)) AS relation,
           any_value(run_seq) AS run_seq
    FROM paired GROUP BY ancestor_run_id, run_id
"""

_IMPROVED = """
    SELECT n.*, o.depth IS NOT NULL AS replaces FROM candidates n
    LEFT JOIN run_ancestry o ON o.ancestor_run_id = n.ancestor_run_id AND o.run_id = n.run_id
    WHERE o.depth IS NULL OR n.depth < o.depth
"""
"""The candidate rows shorter than what is stored (or new), and whether a stored row gives way."""


def link(cursor: duckdb.DuckDBPyConnection, runs: pa.Table) -> None:
    """Place newly registered `runs` (run_id, parent_run_id, forked_from_run_id, write_seq) in `run_ancestry`.

    Runs in the caller's transaction; every statement is over the whole batch, none per run.
    """
    cursor.register("new_runs", runs.select(["run_id", "parent_run_id", "forked_from_run_id", "write_seq"]))
    try:
        _follow(cursor, cursor.execute(LINKS.format(runs="new_runs")).to_arrow_table())
    finally:
        cursor.unregister("new_runs")


def unlink(cursor: duckdb.DuckDBPyConnection, removed: pa.Table) -> None:
    """Re-place the runs below runs that were just deleted from `runs` (prune, `removed` a one-column table of
    their ids), in the caller's transaction.

    A removed run's own links are gone, so every run that had it above loses the rows its links
    gave and has its ancestry found again from its links (a removed run stays the parent named by
    its children, as the walk over the links found it).
    """
    cursor.register("removed_runs", removed)
    try:
        below = cursor.execute(
            "SELECT DISTINCT c.run_id FROM run_ancestry c SEMI JOIN removed_runs r ON c.ancestor_run_id = r.run_id"
            " ANTI JOIN removed_runs d ON c.run_id = d.run_id"
        ).to_arrow_table()
        cursor.register("moved_runs", below)
        cursor.execute(
            "DELETE FROM run_ancestry WHERE run_id IN (SELECT run_id FROM removed_runs UNION ALL"
            " SELECT run_id FROM moved_runs)"
        )
        links = cursor.execute(LINKS.format(runs="(SELECT * FROM runs SEMI JOIN moved_runs USING (run_id))"))
        _follow(cursor, links.to_arrow_table())
    finally:
        cursor.unregister("removed_runs")
        cursor.unregister("moved_runs")


def _follow(cursor: duckdb.DuckDBPyConnection, links: pa.Table) -> None:
    """Add what `links` (from_run_id, run_id, relation) join to `run_ancestry`, until nothing changes."""
    while links.num_rows:
        cursor.register("links", links)
        try:
            cursor.register("candidates", cursor.execute(_CANDIDATES).to_arrow_table())
            improved = cursor.execute(_IMPROVED).to_arrow_table()
            cursor.unregister("candidates")
            if not improved.num_rows:
                return
            cursor.register("improved", improved)
            if pc.any(improved["replaces"]).as_py():
                cursor.execute(
                    "DELETE FROM run_ancestry c USING improved i"
                    " WHERE i.replaces AND c.ancestor_run_id = i.ancestor_run_id AND c.run_id = i.run_id"
                )
            cursor.execute(
                "INSERT INTO run_ancestry SELECT ancestor_run_id, run_id, depth, relation, run_seq FROM improved"
            )
            # Next round: the links whose upper run gained ancestors, or whose lower run gained descendants.
            links = cursor.execute(
                "SELECT * FROM links WHERE from_run_id IN (SELECT run_id FROM improved)"
                " OR run_id IN (SELECT ancestor_run_id FROM improved)"
            ).to_arrow_table()
            cursor.unregister("improved")
        finally:
            cursor.unregister("links")


def deeper_descendants(cursor: duckdb.DuckDBPyConnection, run_id: str) -> pa.Table:
    """The descendants of `run_id` more than HOP_LIMIT links below it (run_id, run_seq, depth): usually none.

    A run at least distance D > HOP_LIMIT is at distance D - k·HOP_LIMIT below some run at exactly
    k·HOP_LIMIT (the shortest way passes one), so each lookup goes HOP_LIMIT levels further.
    """
    found = cursor.execute(
        f"SELECT run_id, run_seq, depth FROM run_ancestry WHERE ancestor_run_id = ? AND depth = {HOP_LIMIT}", [run_id]
    ).to_arrow_table()
    if not found.num_rows:
        return found
    reached = cursor.execute(
        "SELECT run_id FROM run_ancestry WHERE ancestor_run_id = ? UNION SELECT ?", [run_id, run_id]
    ).to_arrow_table()
    deeper, frontier, offset = [], found, HOP_LIMIT
    while frontier.num_rows and offset < MAX_TREE_DEPTH:
        cursor.register("frontier", frontier)
        cursor.register("reached", reached)
        try:
            step = cursor.execute(
                f"SELECT c.run_id, any_value(c.run_seq) AS run_seq, (min(c.depth) + {offset})::INTEGER AS depth"
                " FROM run_ancestry c"
                " SEMI JOIN frontier f ON c.ancestor_run_id = f.run_id ANTI JOIN reached r ON c.run_id = r.run_id"
                f" GROUP BY c.run_id HAVING min(c.depth) + {offset} <= {MAX_TREE_DEPTH}"
            ).to_arrow_table()
        finally:
            cursor.unregister("frontier")
            cursor.unregister("reached")
        deeper.append(step)
        reached = pa.concat_tables([reached, step.select(["run_id"])])
        offset += HOP_LIMIT
        frontier = step.filter(pc.equal(step["depth"], offset))
    return pa.concat_tables(deeper)
