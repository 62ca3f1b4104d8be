"""`gandiva sacct` (slice history like sacct) and `gandiva report --gantt FILE.png` (Gantt + JCT summary)."""

from __future__ import annotations

import argparse
import os
import pwd
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slurm_gandiva.errors import BadRequest

if TYPE_CHECKING:
    from slurm_gandiva.store import Store


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sacct", help="slice history of managed jobs, in sacct's manner")
    _db_options(p)
    p.add_argument("-j", "--jobs", metavar="IDS", help="comma-separated job ids")
    p.add_argument("-u", "--user", dest="users", metavar="USERS", help="comma-separated user names (root only)")
    p.add_argument("-A", "--accounts", metavar="ACCOUNTS", help="comma-separated Slurm accounts")
    p.add_argument("-S", "--starttime", metavar="TIME", help="slices that end at or after TIME")
    p.add_argument("-E", "--endtime", metavar="TIME", help="slices that start at or before TIME")
    p.add_argument("-o", "--format", metavar="FIELDS", help="comma-separated fields, each NAME[%%WIDTH]")
    p.add_argument("-P", "--parsable2", action="store_true", help="'|'-separated output, nothing truncated")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.add_argument("-n", "--noheader", action="store_true", help="no header line")
    p.set_defaults(func=cmd_sacct)

    r = sub.add_parser("report", help="Gantt chart of GPUs over time and a job-completion-time summary")
    _db_options(r)
    r.add_argument("--gantt", metavar="FILE.png", help="write the Gantt chart to this PNG file")
    r.add_argument("-j", "--jobs", metavar="IDS", help="comma-separated job ids")
    r.add_argument("-u", "--user", dest="users", metavar="USERS", help="comma-separated user names (root only)")
    r.add_argument("--topology", metavar="FILE", help="topology file: show every GPU, idle ones too")
    r.set_defaults(func=cmd_report)


def _db_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--db", metavar="URL", help="database URL or SQLite file (default: from the config)")
    g.add_argument("--config", metavar="FILE", help="controller config file to take the database from")


def _split(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def with_array_tasks(store: Any, ids: list[str] | None, users: list[str] | None) -> list[str] | None:
    """`ids` with every task ARRAY_T of each ARRAY among them, as sacct -j ARRAY lists a whole job array."""
    if ids is None or all("_" in i for i in ids):
        return ids
    arrays = {i for i in ids if "_" not in i}
    tasks = [j.job_id for j in store.list_jobs(users=users) if j.job_id.split("_", 1)[0] in arrays and "_" in j.job_id]
    return list(dict.fromkeys([*ids, *tasks]))


def visible_users(requested: Sequence[str] | None, euid: int, me: str) -> list[str] | None:
    """Whose slices the caller may see: root anyone (None = all), others only their own."""
    if euid == 0:
        return None if requested is None else list(requested)
    if requested is None:
        return [me]
    return [u for u in requested if u == me]


def _caller() -> tuple[int, str]:
    euid = os.geteuid()
    try:
        return euid, pwd.getpwuid(euid).pw_name
    except KeyError:
        return euid, str(euid)


def _db_url(args: argparse.Namespace) -> str:
    if args.db:
        return str(args.db)
    from slurm_gandiva.config import load_config

    return load_config(args.config).db_url


def _open_store(args: argparse.Namespace) -> Store:
    from slurm_gandiva.store import Store

    url = _db_url(args)
    path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else url if "://" not in url else None
    if path is not None and not os.path.exists(path):
        # reading must not create an empty database where the controller's should be
        raise BadRequest(f"no database at {url}: pass --db URL or --config FILE of the controller")
    return Store(url, readonly=True)


def cmd_sacct(args: argparse.Namespace) -> int:
    from slurm_gandiva.report import sacct

    sacct.parse_format(args.format)  # a bad --format is refused before the database is opened
    now = time.time()
    start = sacct.parse_time(args.starttime, now) if args.starttime else None
    end = sacct.parse_time(args.endtime, now) if args.endtime else None
    if start is not None and end is not None and end < start:
        raise BadRequest("-E/--endtime is before -S/--starttime: swap them")
    euid, me = _caller()
    users = visible_users(_split(args.users), euid, me)
    with _open_store(args) as store:
        ids = with_array_tasks(store, _split(args.jobs), users)
        slices = store.slices(job_ids=ids, users=users, start=start, end=end, accounts=_split(args.accounts))
    columns = sacct.parse_format(args.format, accounts=sacct.has_accounts(slices))
    if args.json:
        out = sacct.render_json(slices, now)
    elif args.parsable2:
        out = sacct.render_parsable2(slices, columns, now, header=not args.noheader)
    else:
        out = sacct.render_table(slices, columns, now, header=not args.noheader)
    sys.stdout.write(out)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from slurm_gandiva.report import gantt

    now = time.time()
    euid, me = _caller()
    users = visible_users(_split(args.users), euid, me)
    ids = _split(args.jobs)
    topology = None
    if args.topology:
        from slurm_gandiva.topology.file import read_topology

        topology = read_topology(args.topology)
    with _open_store(args) as store:
        ids = with_array_tasks(store, ids, users)
        slices = store.slices(job_ids=ids, users=users)
        jobs = [j for j in store.list_jobs(users=users) if ids is None or j.job_id in ids]
    if args.gantt:
        if not args.gantt.lower().endswith(".png"):
            raise BadRequest(f"--gantt {args.gantt}: the chart is a PNG, name the file *.png")
        gantt.draw_gantt(gantt.layout(slices, now, topology), args.gantt)
        print(f"wrote {args.gantt}")
    sys.stdout.write(gantt.render_jct(gantt.jct_summary(jobs, slices, now)))
    return 0
