"""The report's written account: the run told in plain sentences (the story: what happened in the run and
in each group) and the experiment's question answered, one sentence per change (the answer, also kept in
summary.json). Words only, from summary.json's numbers and the report's data; no matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rmqlab.pipeline.report_data import (
    NAMED_TARGETS,
    Marker,
    PlotData,
    clock_of,
    duplicates_after,
    group_markers,
    real_topics,
    regression_text,
    regressions_after,
    short_cause,
)
from rmqlab.pipeline.unavailability import CAUSE_TEXT, IDLE_THRESHOLD_RMQ_MS, RunClock

T = TypeVar("T")


def time_text(ts: int, clock: RunClock) -> str:
    """t = RocketMQ seconds (wall or simulated seconds)."""
    # z: a change a few ms before t = 0 (a consumer started with the cluster) reads "t = 0.0 s", not -0.0
    if clock.time_scale == 1.0:
        return f"t = {clock.at_s(ts):z.1f} s"
    return f"t = {clock.at_s(ts):z.1f} s ({clock.wall_s(ts):z.2f} s {clock.kind})"


def rmq_s(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f} s"


def _short_s(ms: float) -> str:
    """A duration that may be milliseconds: '4 ms' under a second, '2.8 s' from there."""
    return f"{ms:.0f} ms" if ms < 999.5 else f"{ms / 1000:.1f} s"


# -- the story ----------------------------------------------------------------------------------------


NEMESES_NAMED = 20  # the run's sentence names this many chaos actions; past it, counts by kind first


def narrative(summary: dict[str, Any], data: PlotData | None) -> list[str]:
    """Plain sentences about the run as a whole."""
    run = summary["run"]
    clock = clock_of(data, summary)
    out = []
    if run["start_ms"] is not None and run["end_ms"] is not None:
        span = (run["end_ms"] - run["start_ms"]) / 1000
        scale = clock.time_scale
        lasted = (
            f"{span / scale:.1f} s of RocketMQ time ({span:.2f} s {clock.kind} at time scale {scale:g})"
            if scale != 1
            else f"{span:.3f} s"
        )
        out.append(
            f"The run lasted {lasted} and logged {run['events']} events ({run['malformed_lines']} damaged or "
            "unreadable lines were skipped). Times are counted from the experiment's t = 0 (the start of its "
            "schedule), in RocketMQ seconds as in the experiment file, with "
            f"{clock.kind} seconds beside them."
        )
    if run.get("time_scale_note"):  # the processes logged a time scale other than the one used
        out.append(run["time_scale_note"])
    groups = summary["groups"]
    if groups:
        names = ", ".join(sorted(groups))
        out.append(f"{len(groups)} consumer group(s) took part: {names}.")
    else:
        out.append("No consumer group appears in this run.")
    if data is not None and data.nemeses:
        actions = [f"{n['action']} {n['target']} at {time_text(n['ts_ms'], clock)}" for n in data.nemeses]
        shown = "; ".join(actions[:NEMESES_NAMED])
        if len(actions) > NEMESES_NAMED:  # how many of each kind tells more than the first few
            kinds: dict[str, int] = {}
            for n in data.nemeses:
                kinds[n["action"]] = kinds.get(n["action"], 0) + 1
            shown = (
                ", ".join(f"{c:,} {a}" for a, c in kinds.items()) + f"; the first {NEMESES_NAMED}: {shown}"
            )
        out.append(
            f"The chaos runner wrote {len(actions):,} nemesis event(s) (a restart is written as a stop and a "
            f"start): {shown}."
        )
    elif data is not None:
        out.append("The chaos runner did nothing to the processes in this run.")
    return out


def group_story(
    name: str,
    g: dict[str, Any],
    clock: RunClock,
    orderly: bool,
    dups: list[tuple[Marker | None, int]] = (),  # type: ignore[assignment]
    markers: list[Marker] = (),  # type: ignore[assignment]
) -> list[str]:
    """Plain sentences about one group: what went wrong or right, with the numbers."""
    rmq = g.get("rocketmq_time") or {k: clock.rmq_ms(g[k]) for k in ("orphan_ms", "overlap_ms", "stalled_ms")}
    out = [
        f"{g['consumed_unique']} of the {g['sent']} messages sent to "
        f"{', '.join(real_topics(g['topics'])) or 'no topic'} were consumed; {g['lost']} lost, "
        f"{g['duplicates']} extra deliveries of {g['duplicated_messages']} message(s)."
    ]
    if dups:
        out.append(_duplicates_by_change(dups, clock))
    if g.get("offset_regressions"):
        out.append(_regressions_by_change(g["offset_regressions"], markers, clock))
    un = g.get("unavailability")
    if un and un["total_ms"]:
        causes = ", ".join(
            f"{CAUSE_TEXT[c]} {rmq_s(ms)}" for c, ms in un["by_cause_rocketmq_ms"].items() if ms
        )
        out.append(
            f"{len(un['queues'])} queue(s) were unavailable (messages waiting, nobody consuming them) for "
            f"{rmq_s(un['total_rocketmq_ms'])} of RocketMQ time, summed over queues: {causes}."
        )
    if g["orphan_ms"]:
        out.append(
            f"Queues went without an owner for {rmq_s(rmq['orphan_ms'])} ({g['orphan_ms']} ms {clock.kind}), "
            "summed over queues."
        )
    if g["overlap_ms"]:
        out.append(
            f"Queues had two owners at once for {rmq_s(rmq['overlap_ms'])} "
            f"({g['overlap_ms']} ms {clock.kind}), summed over queues."
        )
    if g["stalled_ms"]:
        out.append(
            f"Queues were held only by paused consumers for {rmq_s(rmq['stalled_ms'])} "
            f"({g['stalled_ms']} ms {clock.kind}), summed over queues."
        )
    if len(g["convergence"]) > GROUP_CHANGES_OVER:
        out += _convergence_in_short(g["convergence"], clock)
    else:
        for e in g["convergence"]:
            when = time_text(e["change_ms"], clock)
            cause = short_cause(e["cause"])
            if e["converged"]:
                out.append(
                    f"After '{cause}' at {when} the group was whole again "
                    f"{rmq_s(clock.rmq_ms(e['convergence_ms']))} later "
                    f"({e['convergence_ms']} ms {clock.kind})."
                )
            else:
                out.append(
                    f"After '{cause}' at {when} the group never became whole again before the run ended."
                )
    reasons = []
    if g["lost"]:
        reasons.append(f"{g['lost']} message(s) were lost")
    if orderly:
        out.append(
            "The group consumed in ORDERLY mode, so one consumer at a time per queue and no going back."
        )
    if orderly and g["concurrent_consume_ms"]:
        reasons.append(f"two consumers processed one queue at once for {g['concurrent_consume_ms']} ms")
    if orderly and g["order_violations"]:
        reasons.append(f"{g['order_violations']} orderly deliveries went backwards")
    never = [e for e in g["convergence"] if not e["converged"]]
    if never:
        reasons.append(f"{len(never)} change(s) were never recovered from")
    if g["verdict"] == "fail":
        out.append("Verdict FAIL: " + ("; ".join(reasons) if reasons else "see the rules below") + ".")
    else:
        out.append(
            "Verdict OK: nothing was lost, order held where it had to, and every change was recovered from."
        )
    return out


def _duplicates_by_change(dups: list[tuple[Marker | None, int]], clock: RunClock) -> str:
    """The story's sentence on which change the extra deliveries followed; past GROUP_CHANGES_OVER
    changes, how many changes had any and the ones with the most."""
    named = [(m, n) for m, n in dups if m is not None]
    before = sum(n for m, n in dups if m is None)
    if len(dups) <= GROUP_CHANGES_OVER:
        parts = [
            f"{n} after {m.text} ({time_text(m.ts, clock)})" if m else f"{n} before any change"
            for m, n in dups
        ]
        return "Extra deliveries by the change they followed: " + "; ".join(parts) + "."
    most = sorted(named, key=lambda mn: -mn[1])[:NAMED_TARGETS]
    text = f"Extra deliveries followed {len(named)} of the changes ({sum(n for _, n in named)} in all); "
    text += "the most " + ", ".join(f"{n} after {m.text} ({time_text(m.ts, clock)})" for m, n in most)
    return text + (f"; {before} before any change." if before else ".")


def _regressions_by_change(entries: list[dict[str, Any]], markers: list[Marker], clock: RunClock) -> str:
    """The story's sentence on the offset regressions, by the change they followed, with the worst."""
    parts = [
        f"after {m.text} ({time_text(m.ts, clock)}) {regression_text(es)}"
        if m
        else f"before any change {regression_text(es)}"
        for m, es in regressions_after(entries, markers)
    ]
    if len(parts) > GROUP_CHANGES_OVER:
        parts = [*parts[:NAMED_TARGETS], f"and after {len(parts) - NAMED_TARGETS} more changes"]
    worst = max(entries, key=lambda e: (e["redelivered"], e["from"] - e["to"]))
    how = "a broker stored it" if worst["event"] == "offset_committed" else "a new owner read it"
    when = time_text(worst["change_ms"], clock)
    return (
        "Committed offsets moving backwards: " + "; ".join(parts) + f". The costliest: {worst['queue']} of "
        f"{worst['topic']} from {worst['from']} back to {worst['to']} at {when} ({how}, {worst['node']}), "
        f"{_plural(worst['redelivered'], 'delivery', 'deliveries')} again."
    )


def _convergence_in_short(entries: list[dict[str, Any]], clock: RunClock) -> list[str]:
    """Past GROUP_CHANGES_OVER changes of membership: how many the group recovered from and how fast
    (median, nine in ten, slowest), and the ones it never recovered from; each is in the chart."""
    done = [e for e in entries if e["converged"]]
    never = [e for e in entries if not e["converged"]]
    out = []
    if done:
        ms = sorted(clock.rmq_ms(e["convergence_ms"]) for e in done)
        slowest = max(done, key=lambda e: e["convergence_ms"])
        out.append(
            f"After {len(done)} of its {len(entries)} changes of membership the group was whole again: "
            f"half of them within {_short_s(ms[(len(ms) - 1) // 2])}, nine in ten within "
            f"{_short_s(ms[math.ceil(0.9 * len(ms)) - 1])}, the slowest {_short_s(ms[-1])} after "
            f"'{short_cause(slowest['cause'])}' at {time_text(slowest['change_ms'], clock)} (RocketMQ time; "
            "every change is in the convergence chart)."
        )
    if never:
        which = _first_named(
            never,
            lambda e: f"'{short_cause(e['cause'])}' at {time_text(e['change_ms'], clock)}",
            lambda rest: f"{len(rest)} more",
        )
        out.append(
            f"After {len(never)} of the {len(entries)} changes it never became whole again before the run "
            f"ended: {which}."
        )
    return out


# -- the answer to the experiment's question ----------------------------------------------------------


def _episodes(un: dict[str, Any], gap_s: float) -> list[dict[str, Any]]:
    """Per queue, unavailable spans closer than `gap_s` joined into one episode with its causes."""
    out = []
    for q in un.get("queues", []):
        cur: dict[str, Any] | None = None
        for sp in q["spans"]:
            if cur is not None and sp["from_s"] - cur["to_s"] <= gap_s:
                cur["to_s"] = sp["to_s"]
            else:
                cur = {
                    "topic": q.get("topic"),
                    "queue": q["queue"],
                    "from_s": sp["from_s"],
                    "to_s": sp["to_s"],
                    "causes": {},
                }
                out.append(cur)
            cur["causes"][sp["cause"]] = cur["causes"].get(sp["cause"], 0.0) + sp["to_s"] - sp["from_s"]
    return out


def answer_for_group(
    name: str,
    g: dict[str, Any],
    clock: RunClock,
    markers: list[Marker],
    dups: list[tuple[Marker | None, int]],
) -> list[str]:
    """One sentence per change the chaos runner made to the group: what it cost, in RocketMQ seconds,
    with the RocketMQ timer that explains it. Past GROUP_CHANGES_OVER changes, those with the same
    outcome share one sentence."""
    gap = IDLE_THRESHOLD_RMQ_MS / 1000
    episodes = _episodes(g.get("unavailability") or {}, gap)
    changes = [m for m in markers if m.kind == "nemesis" and not m.text.startswith(("resume", "start"))]
    expiries = [m for m in markers if m.kind == "channel_expired"]
    takeovers = [m for m in markers if m.kind == "lock_taken_over"]
    dup_of = {id(m): n for m, n in dups if m is not None}
    outcomes: list[tuple[str, float, str]] = []  # (change, t, what followed it)
    for i, m in enumerate(changes):
        at = clock.at_s(m.ts)
        until = clock.at_s(changes[i + 1].ts) if i + 1 < len(changes) else math.inf
        mine = [e for e in episodes if at - 0.5 <= e["from_s"] < until]
        text = ""  # what followed the change; the change itself is named when the sentences are made
        conv = [
            e
            for e in g["convergence"]
            if e["change_ms"] >= m.ts
            and e["cause"].startswith(("kill", "stop"))
            and clock.at_s(e["change_ms"]) < until
        ]
        if mine:
            longest = max(e["to_s"] - e["from_s"] for e in mine)
            causes: dict[str, float] = {}
            for e in mine:
                for c, v in e["causes"].items():
                    causes[c] = causes.get(c, 0.0) + v
            main = max(causes, key=lambda c: causes[c])
            share = ", ".join(
                f"{CAUSE_TEXT[c].split(' (')[0]} {v:.1f} s"
                for c, v in sorted(causes.items(), key=lambda kv: -kv[1])
                if v >= 0.05  # what rounds to 0.0 s says nothing
            )
            # a queue can wait more than once after one change (under POP, each message a hung
            # consumer popped waits for its revive): count queues, and the stretches when more
            queues = len({(e["topic"], e["queue"]) for e in mine})
            stretches = f" in {len(mine)} stretches" if len(mine) > queues else ""
            text += (
                f", {queues} queue(s) were unavailable{stretches} for up to {longest:.1f} s of RocketMQ "
                f"time (summed: {share})"
            )
            end = max(e["to_s"] for e in mine)
            if main == "lock_wait":
                took = [t for t in takeovers if at <= clock.at_s(t.ts) <= end + gap]
                text += (
                    ": the broker keeps a dead client's queue locks until they expire, 60 s after their "
                    "last renewal (every 20 s), and the others take the queues at their next rebalance "
                    "(every 20 s)"
                )
                if took:
                    text += f"; the locks were taken over at t = {clock.at_s(took[0].ts):z.1f} s"
            elif main == "owner_paused":
                exp = [x for x in expiries if at <= clock.at_s(x.ts) <= end + gap]
                notified = [
                    n
                    for n in g.get("broker_markers", [])
                    if n["kind"] == "notify_sent"
                    and n.get("detail") != "register"
                    and at <= n["at_s"] <= end + gap
                ]
                if exp or notified:
                    if exp:
                        e_at = clock.at_s(exp[0].ts)
                        text += (
                            f": the broker expired the paused consumer's channel at t = {e_at:z.1f} s "
                            f"({e_at - at:.1f} s after the pause; 120 s without a heartbeat, "
                            "checked every 10 s)"
                        )
                    if notified:
                        n = notified[0]
                        text += (
                            f"{';' if exp else ':'} {n.get('broker')} notified the group at "
                            f"t = {n['at_s']:z.1f} s ({n.get('detail')})"
                        )
                    else:
                        text += " and sent no NOTIFY"
                    text += (
                        f", and the others took its queues over at t = {end:z.1f} s (their next rebalance)"
                    )
                else:
                    text += (
                        ": the pause was shorter than the broker's 120 s channel expiry, so nobody took "
                        "the queues over until the consumer resumed"
                    )
            elif main == "no_owner" and g.get("mode") == "server-pop":
                # POP queues have no owner: what waited was popped and not acked
                revived = (g.get("pop") or {}).get("revived", 0)
                text += (
                    ": under POP nobody owns a queue; the messages that consumer had popped waited for "
                    f"their invisible time (60 s by default) until the broker revived them ({revived} "
                    "revive(s) in the run) for the others"
                )
            elif main == "no_owner":
                text += ": until the others' rebalance gave the queues a new owner"
            else:
                text += ": their owner kept them but consumed nothing"
        elif conv and all(e["converged"] for e in conv) and g.get("mode", "client") == "client":
            worst = max(clock.rmq_ms(e["convergence_ms"]) for e in conv) / 1000
            text += (
                f", the group was whole again within {worst:.1f} s of RocketMQ time (the broker notified "
                "the group at once) and no queue's messages waited longer than 3 s"
            )
        else:
            text += ", no queue's messages waited longer than 3 s of RocketMQ time"
        n = dup_of.get(id(m), 0)
        after = [x for x in expiries if x.ts > m.ts and (i + 1 >= len(changes) or x.ts < changes[i + 1].ts)]
        n_exp = sum(dup_of.get(id(x), 0) for x in after)
        resumes = [
            r
            for r in markers
            if r.kind == "nemesis"
            and r.text.startswith(("resume", "start"))
            and r.ts > m.ts
            and (i + 1 >= len(changes) or r.ts < changes[i + 1].ts)
        ]
        n_res = sum(dup_of.get(id(r), 0) for r in resumes)
        total = n + n_exp + n_res
        dup = f"; {_plural(total, 'duplicate delivery', 'duplicate deliveries')} followed"
        if n_res and resumes:
            dup += f" ({n_res} after '{resumes[0].text}')"
        end = changes[i + 1].ts if i + 1 < len(changes) else math.inf
        regs = [e for e in g.get("offset_regressions") or [] if m.ts <= e["change_ms"] < end]
        if regs:
            dup += f"; {regression_text(regs)}"
        outcomes.append(Outcome(m.text, at, text, total, dup, regs))
    if len(outcomes) <= GROUP_CHANGES_OVER:
        return [f"{name}: {_after(o.what, o.at, o.text + o.dup)}" for o in outcomes]
    return [f"{name}: {sentence}" for sentence in _grouped(outcomes)]


GROUP_CHANGES_OVER = 6  # more changes than this: those with the same outcome share one sentence


@dataclass
class Outcome:
    """A change of the answer and what followed it: ``text`` the unavailability or convergence,
    ``dup`` the duplicate deliveries (``dups`` of them) as their own sentence tells them."""

    what: str
    at: float
    text: str
    dups: int
    dup: str
    regressions: list[dict[str, Any]] = field(default_factory=list)  # offset regressions it was followed by


def _after(what: str, at: float, text: str) -> str:
    """The answer's sentence for one change and what followed it."""
    return f"after '{what}' at t = {at:z.1f} s{text}."


def _grouped(outcomes: list[Outcome]) -> list[str]:
    """One sentence per distinct outcome, in the order of its first change: a change whose outcome no
    other change shares keeps its own sentence; the others are counted, the first few named, and their
    duplicate deliveries summed (counts differ from change to change more than outcomes do)."""
    by_outcome: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_outcome.setdefault(o.text, []).append(o)
    out = []
    for text, changes in by_outcome.items():
        if len(changes) == 1:
            out.append(_after(changes[0].what, changes[0].at, text + changes[0].dup))
            continue
        named = _first_named(
            changes,
            lambda o: f"'{o.what}' at t = {o.at:z.1f} s",
            lambda rest: f"{len(rest)} more up to t = {rest[-1].at:z.1f} s",
        )
        total = sum(o.dups for o in changes)
        most = max(changes, key=lambda o: o.dups)
        dup = f"; {_plural(total, 'duplicate delivery', 'duplicate deliveries')} followed them in all"
        if total:
            dup += f", at most {most.dups} after one ('{most.what}' at t = {most.at:z.1f} s)"
        regs = [e for o in changes for e in o.regressions]
        if regs:
            dup += f"; {regression_text(regs)}"
        out.append(f"after each of {len(changes)} changes ({named}){text}{dup}.")
    return out


def _first_named(items: list[T], name: Callable[[T], str], rest: Callable[[list[T]], str]) -> str:
    """'a, b and c', or past NAMED_TARGETS + 1 items 'a, b, c and <rest of them>'."""
    shown = items if len(items) <= NAMED_TARGETS + 1 else items[:NAMED_TARGETS]
    names = [name(i) for i in shown] + ([rest(items[len(shown) :])] if len(items) > len(shown) else [])
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one}" if n == 1 else f"{n or 'no'} {many}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def known_figure(summary: dict[str, Any], figure: str) -> float:
    """A catalogue entry's figure (a group field of summary.json, dotted when nested) summed over the
    run's groups."""
    total = 0.0
    for g in summary["groups"].values():
        value: Any = g
        for part in figure.split("."):
            value = value[part]
        total += float(value)
    return total


def known_answer(known: dict[str, Any], summary: dict[str, Any]) -> str:
    """The first sentence of a catalogue entry's run (the manifest's ``known``): whether the problem
    appeared, with its figure, and which release removes it."""
    value = known_figure(summary, known["figure"])
    above = known.get("shows_above", 0)
    shown = f"{known['figure']} = {value:g}" + (f" {known['unit']}" if known.get("unit") else "")
    if above:
        shown += f" (the problem: more than {above:g})"
    name = f"known/{known['name']}" + (f" ({', '.join(known['issues'])})" if known.get("issues") else "")
    fixed = known["variant"] == "fixed"
    remedy = known.get("remedy")  # a problem no release fixed: its remedy is the fixed variant
    if fixed:
        behaviour = f"with the remedy, {remedy}" if remedy else f"with the fix of {known['fixed_in']}"
    else:
        behaviour = f"with the behaviour of {known['affected']}"
    if value > above:
        if fixed:
            return f"Yes: the problem of {name} appeared, {shown}, even {behaviour} ({known['change']})."
        cure = f"{remedy} avoids it" if remedy else f"RocketMQ {known['fixed_in']} removes it"
        return f"Yes: the problem of {name} appeared, {shown}, {behaviour}; {cure} ({known['change']})."
    if fixed:
        return f"No: the problem of {name} did not appear, {shown}, {behaviour} ({known['change']})."
    return f"No: the problem of {name} did not appear, {shown}, {behaviour}."


def manifest_engine(manifest: Any) -> str | None:
    """The Apache engine a run's manifest names (``versions.engine``), None for the emulator's runs."""
    versions = manifest.get("versions") if isinstance(manifest, dict) else None
    engine = versions.get("engine") if isinstance(versions, dict) else None
    return engine if isinstance(engine, str) and engine != "emulator" else None


def engine_note(engine: str) -> str:
    """What a run on Apache's own broker cannot show: the broker-side events the lab's broker writes."""
    return (
        f"The name server and brokers of this run were Apache RocketMQ's own (engine {engine}), which write "
        "none of the lab's events, so the broker-side figures are missing: consumer registrations and "
        "channel closes or expiry (consumer_registered, consumer_unregistered), the notifications the "
        "broker sent, queue-lock grants, the broker's pulls and sends, and its own offset table (the "
        "offset figures come from the clients' commits); every consumer-side figure and the verdict come "
        "from the clients' events."
    )


def answers(
    summary: dict[str, Any],
    data: PlotData | None,
    known: dict[str, Any] | None = None,
    engine: str | None = None,
) -> list[str]:
    """The experiment's question answered, one sentence per change, from summary.json's numbers; a
    catalogue entry's run (``known``, from its manifest) says first whether the problem appeared; a run
    on an Apache ``engine`` says last which figures its broker could not give."""
    first = [known_answer(known, summary)] if known else []
    last = [engine_note(engine)] if engine else []
    if data is None:
        return first + last
    clock = clock_of(data, summary)
    out = first
    for name, g in summary["groups"].items():
        markers = group_markers(data, name, g)
        said = answer_for_group(name, g, clock, markers, duplicates_after(data, name, markers))
        if len(summary["groups"]) == 1:  # the group's name adds nothing
            said = [_capital(x[len(name) + 2 :]) for x in said]
        out += said
    return out + last
