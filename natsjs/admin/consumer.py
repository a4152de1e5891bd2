"""``natsjs consumer ...``: natscli's consumer commands over the JetStream API.

``add`` asks what its flags leave out (``--defaults``: a pull consumer with explicit
acks delivering everything), ``info`` shows the configuration, the ``Cluster
Information`` block and the state, ``next`` pulls and acknowledges messages,
``report`` tables every consumer of a stream with its placement, and ``cluster
step-down`` moves a consumer's leadership as the documentation shows for streams.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import time

from natsjs.admin import prompt
from natsjs.admin.args import duration_arg, int_arg, json_flag, metadata_arg
from natsjs.admin.errors import CLIError, q
from natsjs.admin.render import (Columns, Table, duration, emit, go_duration, local_rfc3339,
                                 local_time, parse_duration, parse_time, print_json, since, NS)
from natsjs.admin.stream import (edit_plan, leader_step_down, pick_stream, render_cluster,
                                 replica_state, save_config)


def register(top) -> None:
    g = top.group("consumer", "JetStream consumer management", aliases=["con", "obs", "c"])

    p = g.command("add", "Creates a new consumer", add, aliases=["create", "new"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    config_flags(p)
    p.add_argument("--config", help="JSON file to read configuration from")
    p.add_argument("--defaults", action="store_true", help="Accept default values for all prompts")
    p.add_argument("--output", help="Save configuration instead of creating")
    json_flag(p)

    p = g.command("info", "Consumer information", info, aliases=["nfo"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    json_flag(p)

    p = g.command("state", "Consumer state", state)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    json_flag(p)

    p = g.command("ls", "List known consumers", ls, aliases=["list"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("-n", "--names", action="store_true", help="Show just the consumer names")
    json_flag(p)

    p = g.command("rm", "Removes a consumer", rm, aliases=["delete", "del"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    p.add_argument("-f", "--force", action="store_true", help="Force removal without prompting")

    p = g.command("next", "Retrieves messages from Pull consumers without interactive prompts",
                  next_)
    p.add_argument("stream", help="Stream name")
    p.add_argument("consumer", help="Consumer name")
    p.add_argument("--ack", action=argparse.BooleanOptionalAction, default=None,
                   help="Acknowledge received message (default true)")
    p.add_argument("--nak", action="store_true", help="Negatively acknowledge the message")
    p.add_argument("--term", action="store_true", help="Terms the message")
    p.add_argument("-r", "--raw", action="store_true", help="Show only the message")
    p.add_argument("--count", type=int, default=1, help="Number of messages to fetch")

    p = g.command("report", "Reports on consumer statistics", report)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("-r", "--raw", action="store_true", help="Show un-formatted numbers")
    json_flag(p)

    p = g.command("edit", "Edits the configuration of a consumer", edit, aliases=["update"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    config_flags(p)
    p.add_argument("--config", help="JSON file to read configuration from")
    p.add_argument("-f", "--force", action="store_true", help="Force edit without prompting")
    p.add_argument("--dry-run", action="store_true", help="Only shows differences")
    json_flag(p)

    p = g.command("pause", "Pause a consumer until a later time", pause)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    p.add_argument("until", nargs="?", metavar="TIME",
                   help="Pause until a specific time (eg %s) or for a duration (eg 1h30m)"
                        % time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
    p.add_argument("-f", "--force", action="store_true", help="Force pause without prompting")

    p = g.command("resume", "Resume a paused consumer", resume)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    p.add_argument("-f", "--force", action="store_true", help="Force resume without prompting")

    c = g.group("cluster", "Manages a clustered consumer", aliases=["c"])
    p = c.command("step-down", "Force a new leader election by standing down the current "
                  "leader", step_down, aliases=["stepdown", "sd", "elect", "down", "d"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("consumer", nargs="?", help="Consumer name")
    p.add_argument("--preferred", default="", help="Prefer placing the leader on a specific host")
    p.add_argument("-f", "--force", action="store_true", help="Force leader step down")


def config_flags(p) -> None:
    b = argparse.BooleanOptionalAction
    p.add_argument("--ack", choices=["none", "all", "explicit"], help="Acknowledgment policy")
    p.add_argument("--deliver", default="", help="Start policy (all, new, last, subject, 1h, "
                                                 "msg sequence)")
    p.add_argument("--deliver-group", default=None, help="Push delivery queue group")
    p.add_argument("--description", default="", help="Sets a contextual description")
    p.add_argument("--ephemeral", action="store_true", help="Create an ephemeral consumer")
    p.add_argument("--filter", action="append", help="Filter Stream by subjects")
    p.add_argument("--flow-control", action=b, default=None, help="Push consumer flow control")
    p.add_argument("--heartbeat", default="", help="Idle Push consumer heartbeats")
    p.add_argument("--headers-only", action=b, default=None, help="Deliver only headers")
    p.add_argument("--max-deliver", type=int, default=0, help="Maximum delivery attempts")
    p.add_argument("--max-pending", type=int, default=None, help="Maximum pending Acks")
    p.add_argument("--max-waiting", type=int, default=0, help="Maximum outstanding pulls")
    p.add_argument("--max-pull-batch", type=int, default=0, help="Maximum pull batch size")
    p.add_argument("--max-pull-expire", default="", help="Maximum pull expiry")
    p.add_argument("--pull", action="store_true", help="Deliver messages in 'pull' mode")
    p.add_argument("--replay", choices=["instant", "original"], help="Replay Policy")
    p.add_argument("--target", default="", help="Push based delivery target subject")
    p.add_argument("--wait", default="", help="Acknowledgment waiting time")
    p.add_argument("--inactive-threshold", default="", help="Idle time before removal")
    p.add_argument("--memory", action="store_true", help="Keep the consumer state in memory")
    p.add_argument("--replicas", type=int, default=0, help="Replica count (default: the "
                                                           "stream's)")
    p.add_argument("--metadata", action="append", help="Adds metadata KEY=VALUE")


def _start_policy(cfg: dict, policy: str) -> None:
    policy = policy.strip()
    if policy == "all":
        cfg["deliver_policy"] = "all"
    elif policy == "last":
        cfg["deliver_policy"] = "last"
    elif policy in ("new", "next"):
        cfg["deliver_policy"] = "new"
    elif policy in ("subject", "last_per_subject"):
        cfg["deliver_policy"] = "last_per_subject"
    elif re.fullmatch(r"\d+", policy):
        cfg["deliver_policy"] = "by_start_sequence"
        cfg["opt_start_seq"] = int(policy)
    else:
        ago = duration_arg(policy, "start policy")
        start = time.time() - ago / NS
        cfg["deliver_policy"] = "by_start_time"
        cfg["opt_start_time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)) + "Z"


def _apply(cfg: dict, a) -> None:
    """Flags that were given, over ``cfg``."""
    if a.description:
        cfg["description"] = a.description
    if a.ack:
        cfg["ack_policy"] = a.ack
    if a.deliver:
        _start_policy(cfg, a.deliver)
    if a.deliver_group is not None:
        cfg["deliver_group"] = a.deliver_group
    if a.filter:
        subjects = [s for f in a.filter for s in re.split(r"[,\s]+", f) if s]
        cfg.pop("filter_subject", None)
        cfg.pop("filter_subjects", None)
        if len(subjects) == 1:
            cfg["filter_subject"] = subjects[0]
        elif subjects:
            cfg["filter_subjects"] = subjects
    if a.flow_control is not None:
        cfg["flow_control"] = a.flow_control
    if a.heartbeat and a.heartbeat != "-1":
        cfg["idle_heartbeat"] = duration_arg(a.heartbeat, "heartbeat")
    if a.headers_only is not None:
        cfg["headers_only"] = a.headers_only
    if a.max_deliver:
        cfg["max_deliver"] = a.max_deliver
    if a.max_pending is not None and a.max_pending >= 0:
        cfg["max_ack_pending"] = a.max_pending
    if a.max_waiting:
        cfg["max_waiting"] = a.max_waiting
    if a.max_pull_batch:
        cfg["max_batch"] = a.max_pull_batch
    if a.max_pull_expire:
        cfg["max_expires"] = duration_arg(a.max_pull_expire, "maximum pull expiry")
    if a.replay:
        cfg["replay_policy"] = a.replay
    if a.wait:
        cfg["ack_wait"] = duration_arg(a.wait, "ack wait")
    if a.inactive_threshold:
        cfg["inactive_threshold"] = duration_arg(a.inactive_threshold, "inactive threshold")
    if a.memory:
        cfg["mem_storage"] = True
    if a.replicas:
        cfg["num_replicas"] = a.replicas
    if a.metadata:
        cfg["metadata"] = metadata_arg(a.metadata)


def prepare_config(a) -> dict:
    if a.config:
        try:
            with open(a.config) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            raise CLIError("could not read %s: %s" % (a.config, e)) from None
        cfg = cfg.get("config", cfg)
        if a.consumer:
            cfg["durable_name"] = a.consumer
        _apply(cfg, a)
        return cfg
    d = a.defaults
    if not a.consumer and not a.ephemeral:
        a.consumer = prompt.ask("Consumer name", required=True, flag="a consumer name")
    if a.consumer and re.search(r"[.*>]", a.consumer):
        raise CLIError("durable name can not contain '.', '*', '>'")
    cfg: dict = {"ack_policy": "explicit", "replay_policy": "instant"}
    if a.consumer:
        cfg["name" if a.ephemeral else "durable_name"] = a.consumer
    target = a.target
    if not a.pull and not target and not d:
        target = prompt.ask("Delivery target (empty for Pull Consumers)", default="",
                            flag="--target or --pull")
    pull = not target
    if target:
        cfg["deliver_subject"] = target
        if a.deliver_group is None and not d:
            group = prompt.ask("Delivery Queue Group", default="", flag="--deliver-group")
            if group:
                cfg["deliver_group"] = group
    _start_policy(cfg, a.deliver or ("all" if d else prompt.ask(
        "Start policy (all, new, last, subject, 1h, msg sequence)", default="all",
        flag="--deliver")))
    if not a.ack:
        dflt = "explicit" if pull else "none"
        cfg["ack_policy"] = dflt if d else prompt.select(
            "Acknowledgment policy", ["none", "all", "explicit"] if not pull
            else ["all", "explicit"], default=dflt, flag="--ack")
    if not a.replay:
        cfg["replay_policy"] = "instant" if d else prompt.select(
            "Replay policy", ["instant", "original"], default="instant", flag="--replay")
    if not a.filter and not d:
        f = prompt.ask("Filter Stream by subjects (blank for all)", default="", flag="--filter")
        if f:
            a.filter = [f]
    if not a.max_deliver and not d:
        md = int_arg(prompt.ask("Maximum Allowed Deliveries", default="-1",
                             flag="--max-deliver"), "maximum deliveries")
        if md not in (0, -1):
            cfg["max_deliver"] = md
    if a.max_pending is None and not d:
        mp = int_arg(prompt.ask("Maximum Acknowledgments Pending", default="0",
                             flag="--max-pending"), "maximum pending")
        if mp > 0:
            cfg["max_ack_pending"] = mp
    if target and not a.heartbeat and not d:
        hb = prompt.ask("Idle Heartbeat", default="0s", flag="--heartbeat")
        if hb not in ("", "0", "0s", "-1"):
            cfg["idle_heartbeat"] = duration_arg(hb, "heartbeat")
    if target and a.flow_control is None and not d:
        a.flow_control = prompt.confirm("Enable Flow Control, ie --flow-control", False)
    _apply(cfg, a)
    return cfg


async def pick_consumer(rt, stream: str, name: str | None) -> str:
    if name:
        return name
    js = await rt.js()
    names = await js.consumer_names(stream)
    if not names:
        raise CLIError("stream %s has no consumers" % q(stream))
    if len(names) == 1:
        return names[0]
    return prompt.select("Select a Consumer", names, flag="a consumer name")


# ---- showing ------------------------------------------------------------------------------

_DELIVER = {"all": "All", "last": "Last", "new": "New", "last_per_subject": "Last Per Subject"}
_ACK = {"none": "None", "all": "All", "explicit": "Explicit"}
_REPLAY = {"instant": "Instant", "original": "Original"}


def consumer_screen(ci: dict, state_only: bool = False) -> Columns:
    cfg = ci.get("config") or {}
    c = Columns("%s for Consumer %s > %s created %s" % (
        "State" if state_only else "Information", ci.get("stream_name", ""), ci.get("name", ""),
        local_rfc3339(ci.get("created"))))
    if not state_only:
        c.title("Configuration")
        c.row_nonempty("Name", cfg.get("name"))
        durable = cfg.get("durable_name")
        c.row_if("Durable Name", durable, durable and durable != cfg.get("name"))
        c.row_nonempty("Description", cfg.get("description"))
        if cfg.get("deliver_subject"):
            c.row("Delivery Subject", cfg["deliver_subject"])
        else:
            c.row("Pull Mode", True)
        if cfg.get("filter_subject"):
            c.row("Filter Subject", cfg["filter_subject"])
        elif cfg.get("filter_subjects"):
            c.row("Filter Subjects", cfg["filter_subjects"])
        dp = cfg.get("deliver_policy", "all")
        if dp == "by_start_time":
            c.row("Deliver Policy", "Since %s" % local_time(cfg.get("opt_start_time")))
        elif dp == "by_start_sequence":
            c.row("Deliver Policy", "From Sequence %d" % cfg.get("opt_start_seq", 0))
        else:
            c.row("Deliver Policy", _DELIVER.get(dp, dp))
        c.row_if("Deliver Queue Group", cfg.get("deliver_group"),
                 cfg.get("deliver_group") and cfg.get("deliver_subject"))
        ack = cfg.get("ack_policy", "none")
        c.row("Ack Policy", _ACK.get(ack, ack))
        c.row_if("Ack Wait", duration(cfg.get("ack_wait") or 0), ack != "none")
        rp = cfg.get("replay_policy", "instant")
        c.row("Replay Policy", _REPLAY.get(rp, rp))
        md = cfg.get("max_deliver", -1)
        c.row_if("Maximum Deliveries", md, md not in (-1, 0))
        c.row_nonempty("Sampling Rate", cfg.get("sample_freq"))
        c.row_if("Max Ack Pending", cfg.get("max_ack_pending"), (cfg.get("max_ack_pending") or 0) > 0)
        c.row_if("Max Waiting Pulls", cfg.get("max_waiting"), (cfg.get("max_waiting") or 0) > 0)
        c.row_if("Idle Heartbeat", duration(cfg.get("idle_heartbeat") or 0),
                 cfg.get("idle_heartbeat"))
        c.row_if("Flow Control", bool(cfg.get("flow_control")), cfg.get("deliver_subject"))
        c.row_if("Headers Only", True, cfg.get("headers_only"))
        c.row_if("Inactive Threshold", duration(cfg.get("inactive_threshold") or 0),
                 cfg.get("inactive_threshold") and not cfg.get("deliver_subject"))
        c.row_if("Max Pull Expire", duration(cfg.get("max_expires") or 0), cfg.get("max_expires"))
        c.row_if("Max Pull Batch", cfg.get("max_batch"), cfg.get("max_batch"))
        c.row_if("Replicas", cfg.get("num_replicas"), cfg.get("num_replicas"))
        c.row_if("Memory Storage", True, cfg.get("mem_storage"))
        if ci.get("paused"):
            c.row("Paused Until Deadline", "%s (%s remaining)" % (
                local_time(cfg.get("pause_until")), _round_s(ci.get("pause_remaining", 0))))
        elif local_time(cfg.get("pause_until")):
            c.row("Paused Until Deadline", "%s (passed)" % local_time(cfg["pause_until"]))
    cl = ci.get("cluster") or {}
    if cl.get("name"):
        c.title("Cluster Information")
        c.row("Name", cl["name"])
        c.row("Leader", cl.get("leader", ""))
        for r in cl.get("replicas") or []:
            c.row("Replica", replica_state(r))
    c.title("State")
    dl, af = ci.get("delivered") or {}, ci.get("ack_floor") or {}

    def seqs(d, what):
        text = "Consumer sequence: %s Stream sequence: %s" % (
            "{:,}".format(d.get("consumer_seq", 0)), "{:,}".format(d.get("stream_seq", 0)))
        if d.get("last_active"):
            text += " %s: %s ago" % (what, duration(since(d["last_active"])))
        return text

    c.row("Last Delivered Message", seqs(dl, "Last delivery"))
    if cfg.get("ack_policy", "none") != "none":
        c.row("Acknowledgment Floor", seqs(af, "Last Ack"))
        mp = cfg.get("max_ack_pending") or 0
        c.row("Outstanding Acks", "%s out of maximum %s" % (
            "{:,}".format(ci.get("num_ack_pending", 0)), "{:,}".format(mp)) if mp > 0
            else ci.get("num_ack_pending", 0))
        c.row("Redelivered Messages", ci.get("num_redelivered", 0))
    c.row("Unprocessed Messages", ci.get("num_pending", 0))
    if not cfg.get("deliver_subject"):
        mw = cfg.get("max_waiting") or 0
        c.row("Waiting Pulls", "%s of %s" % ("{:,}".format(ci.get("num_waiting", 0)),
                                             "maximum {:,}".format(mw) if mw else "unlimited"))
    elif ci.get("push_bound"):
        c.row("Active Interest", "Active using Queue Group %s" % cfg["deliver_group"]
              if cfg.get("deliver_group") else "Active")
    else:
        c.row("Active Interest", "No interest")
    if ci.get("paused"):
        c.row("Paused Until", "%s (%s remaining)" % (_paused_until(ci),
                                                     _round_s(ci.get("pause_remaining", 0))))
    return c


def _round_s(ns) -> str:
    """Go's Duration.Round(time.Second) as a string: '59m59s', '1h0m0s'."""
    return go_duration(int(round((ns or 0) / NS)) * NS)


def _paused_until(ci: dict) -> str:
    """The info's timestamp plus what remains of the pause, in local time."""
    import datetime as dt
    ts = parse_time(ci.get("ts")) or dt.datetime.now(dt.timezone.utc)
    until = ts + dt.timedelta(microseconds=(ci.get("pause_remaining") or 0) // 1000)
    return until.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def show_consumer(ci: dict, as_json: bool = False, state_only: bool = False) -> None:
    emit(ci, as_json, lambda v: consumer_screen(v, state_only))


# ---- commands -----------------------------------------------------------------------------


async def add(rt) -> None:
    a = rt.args
    stream = await pick_stream(rt, a.stream)
    cfg = prepare_config(a)
    if a.output:
        save_config(a.output, cfg)
        return
    js = await rt.js()
    name = cfg.get("durable_name") or cfg.get("name")
    op = "CONSUMER.CREATE.%s.%s" % (stream, name) if name else "CONSUMER.CREATE." + stream
    ci = await js.request(op, {"stream_name": stream, "config": cfg, "action": "create"}
                          if name else {"stream_name": stream, "config": cfg},
                          doing="could not create Consumer")
    show_consumer(ci, a.json)


async def _load(rt):
    """The consumer the arguments name (or the prompts pick) and its info."""
    stream = await pick_stream(rt, rt.args.stream)
    name = await pick_consumer(rt, stream, rt.args.consumer)
    js = await rt.js()
    return js, stream, name, await js.consumer_info(stream, name)


async def info(rt) -> None:
    a = rt.args
    _js, _stream, _name, ci = await _load(rt)
    show_consumer(ci, a.json, getattr(a, "state_only", False))


async def state(rt) -> None:
    rt.args.state_only = True
    await info(rt)


async def ls(rt) -> None:
    a = rt.args
    stream = await pick_stream(rt, a.stream)
    js = await rt.js()
    if a.names:
        names = await js.consumer_names(stream)
        if a.json:
            print_json(names)
        else:
            for n in names:
                print(n)
        return
    infos, _ = await js.paged("CONSUMER.LIST." + stream, "consumers")
    if a.json:
        print_json(sorted(i["name"] for i in infos))
        return
    if not infos:
        print("No Consumers defined")
        return
    t = Table("Consumers", ["Name", "Description", "Created", "Ack Pending", "Unprocessed",
                            "Last Delivery"])
    for ci in sorted(infos, key=lambda i: i["name"]):
        last = (ci.get("delivered") or {}).get("last_active")
        t.add(ci["name"], (ci.get("config") or {}).get("description", ""),
              local_time(ci.get("created")), ci.get("num_ack_pending", 0),
              ci.get("num_pending", 0), duration(since(last)) if last else "never")
    t.print()


async def rm(rt) -> None:
    a = rt.args
    if a.force and not (a.stream and a.consumer):
        raise CLIError("--force requires a stream and consumer name")
    stream = await pick_stream(rt, a.stream)
    name = await pick_consumer(rt, stream, a.consumer)
    if not a.force and not prompt.confirm("Really delete Consumer %s > %s" % (stream, name),
                                          False):
        return
    js = await rt.js()
    await js.request("CONSUMER.DELETE.%s.%s" % (stream, name), None,
                     doing="could not remove Consumer")


async def next_(rt) -> None:
    """Pull ``--count`` messages one request at a time, each printed as natscli does
    and acknowledged (or nak'd / term'd) before the next."""
    import nats.errors

    a = rt.args
    ack = a.ack
    if a.term:
        if ack:
            raise CLIError("can not both Acknowledge and Terminate message")
        ack = False
    if ack is None:
        ack = not a.nak
    if ack and a.nak:
        raise CLIError("can not both Acknowledge and NaK message")
    js = await rt.js()
    nc = await rt.conn()
    subject = "%s.CONSUMER.MSG.NEXT.%s.%s" % (js.prefix, a.stream, a.consumer)
    for _ in range(max(1, a.count)):
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, max_msgs=1)
        expires = int(max(rt.timeout - 0.2, 0.1) * NS)
        await nc.publish(subject, json.dumps({"batch": 1, "expires": expires}).encode(),
                         reply=inbox)
        try:
            msg = await sub.next_msg(timeout=rt.timeout)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            await _fail_if_not_pull(js, a.stream, a.consumer)
            raise CLIError("no message received: nats: timeout") from None
        status = (msg.headers or {}).get("Status") if msg.headers else None
        if status == "503":
            await _fail_if_not_pull(js, a.stream, a.consumer)
            raise CLIError("no message received: no responders available for request")
        if status in ("404", "408", "409"):
            raise CLIError("no message received: %s %s" % (
                status, (msg.headers or {}).get("Description", "no messages")))
        if not a.raw:
            meta = _ack_meta(msg.reply)
            if meta:
                print("[%s] subj: %s / tries: %d / cons seq: %d / str seq: %d / pending: %s"
                      % (time.strftime("%H:%M:%S"), msg.subject, meta["delivered"],
                         meta["cons_seq"], meta["stream_seq"], "{:,}".format(meta["pending"])))
            else:
                print("--- subject: %s reply: %s" % (msg.subject, msg.reply))
            hdrs = {k: v for k, v in (msg.headers or {}).items()}
            if hdrs:
                print("\nHeaders:\n")
                for k, v in hdrs.items():
                    print("  %s: %s" % (k, v))
                print("\nData:\n")
            print()
        print(msg.data.decode(errors="replace"))
        if a.term:
            await nc.publish(msg.reply, b"+TERM")
            await nc.flush()
            print("\nTerminated message")
        elif ack or a.nak:
            body = b"+ACK" if ack else b"-NAK"
            # a request so that the server confirms the ack before we exit (natscli AckSync)
            try:
                await nc.request(msg.reply, body, timeout=rt.timeout)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                    asyncio.TimeoutError):
                await nc.publish(msg.reply, body)
                await nc.flush()
            if not a.raw:
                print("\nAcknowledged message" if ack else "\nNaked message")
            if not a.raw and a.count > 1:
                print()


async def _fail_if_not_pull(js, stream: str, consumer: str) -> None:
    ci = await js.consumer_info(stream, consumer)
    if (ci.get("config") or {}).get("deliver_subject"):
        raise CLIError("consumer %s is not a Pull consumer" % q(consumer))


def _ack_meta(reply: str) -> dict | None:
    """The delivery facts in a JetStream ack subject ($JS.ACK.<stream>.<consumer>.
    <delivered>.<sseq>.<cseq>.<ts>.<pending>, with or without domain and hash)."""
    if not reply or not reply.startswith("$JS.ACK."):
        return None
    parts = reply.split(".")
    if len(parts) == 9:
        base = 2
    elif len(parts) >= 12:
        base = 4
    else:
        return None
    try:
        return {"delivered": int(parts[base + 2]), "stream_seq": int(parts[base + 3]),
                "cons_seq": int(parts[base + 4]), "pending": int(parts[base + 6])}
    except (ValueError, IndexError):
        return None


async def report(rt) -> None:
    a = rt.args
    stream = await pick_stream(rt, a.stream)
    js = await rt.js()
    sinfo = await js.stream_info(stream)
    infos, _ = await js.paged("CONSUMER.LIST." + stream, "consumers")
    if a.json:
        print_json(infos)
        return
    msgs = (sinfo.get("state") or {}).get("messages", 0)
    t = Table("Consumer report for %s with %s consumers" % (stream, "{:,}".format(len(infos))),
              ["Consumer", "Mode", "Ack Policy", "Ack Wait", "Ack Pending", "Redelivered",
               "Unprocessed", "Ack Floor", "Cluster"])
    for ci in sorted(infos, key=lambda i: i["name"]):
        cfg = ci.get("config") or {}
        mode = "Push" if cfg.get("deliver_subject") else "Pull"
        ack = _ACK.get(cfg.get("ack_policy", "none"), "")
        pending = ci.get("num_pending", 0)
        if a.raw:
            t.add(ci["name"], mode, ack, str(cfg.get("ack_wait", 0)),
                  str(ci.get("num_ack_pending", 0)), str(ci.get("num_redelivered", 0)),
                  str(pending), str((ci.get("ack_floor") or {}).get("stream_seq", 0)),
                  render_cluster(ci.get("cluster")))
            continue
        unprocessed = "0"
        if pending:
            pct = min(100, math.floor(pending / msgs * 100)) if msgs else 100
            unprocessed = "%s / %d%%" % ("{:,}".format(pending), pct)
        t.add(ci["name"], mode, ack, duration(cfg.get("ack_wait") or 0),
              ci.get("num_ack_pending", 0), ci.get("num_redelivered", 0), unprocessed,
              (ci.get("ack_floor") or {}).get("stream_seq", 0),
              render_cluster(ci.get("cluster")))
    t.print()


async def edit(rt) -> int:
    a = rt.args
    stream = await pick_stream(rt, a.stream)
    name = await pick_consumer(rt, stream, a.consumer)
    js = await rt.js()
    current = (await js.consumer_info(stream, name))["config"]
    if a.config:
        with open(a.config) as f:
            cfg = json.load(f)
    else:
        cfg = json.loads(json.dumps(current))
        _apply(cfg, a)
    go = edit_plan(current, cfg, a, "Really edit Consumer %s > %s" % (stream, name))
    if go is not None:
        return go
    ci = await js.request("CONSUMER.CREATE.%s.%s" % (stream, name),
                          {"stream_name": stream, "config": cfg, "action": "update"},
                          doing="could not edit Consumer %s" % name)
    show_consumer(ci, a.json)
    return 0


async def step_down(rt) -> None:
    a = rt.args
    js, stream, name, ci = await _load(rt)
    body = {"placement": {"preferred": a.preferred}} if a.preferred else None
    await leader_step_down(
        "consumer %s > %s" % (q(stream), q(name)), ci, lambda: js.consumer_info(stream, name),
        lambda: js.request("CONSUMER.LEADER.STEPDOWN.%s.%s" % (stream, name), body,
                           doing="could not step down the leader of %s > %s" % (stream, name)),
        show_consumer, a.force)


# ---- pause and resume ---------------------------------------------------------------------


def parse_pause_until(text: str):
    """natscli parsePauseUntil: a 'YYYY-MM-DD HH:MM:SS' time (UTC, as Go's time.Parse
    reads it) or a duration from now."""
    import datetime as dt
    try:
        return dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S").replace(
            tzinfo=dt.timezone.utc)
    except ValueError:
        pass
    try:
        ns = parse_duration(text)
    except ValueError:
        raise CLIError("could not parse the pause time as either timestamp or duration") \
            from None
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(microseconds=ns // 1000)


def _rfc3339(t) -> str:
    return t.astimezone(__import__("datetime").timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


async def pause(rt) -> None:
    """$JS.API.CONSUMER.PAUSE.<stream>.<consumer> with ``pause_until``."""
    import datetime as dt
    a = rt.args
    js, stream, name, _ci = await _load(rt)
    until = a.until
    if not until:
        dflt = (dt.datetime.now() + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
        until = prompt.ask("Pause until (time or duration)", default=dflt, required=True,
                           flag="a time or duration")
    ts = parse_pause_until(until)
    if not a.force and not prompt.confirm("Really pause Consumer %s > %s until %s" % (
            stream, name, ts.astimezone().strftime("%Y-%m-%d %H:%M:%S")), False):
        return
    resp = await js.request("CONSUMER.PAUSE.%s.%s" % (stream, name),
                            {"pause_until": _rfc3339(ts)},
                            doing="could not pause Consumer %s > %s" % (stream, name))
    if not resp.get("paused"):
        raise CLIError("pause request failed, perhaps due to a time in the past")
    print("Paused %s > %s until %s (%s)" % (stream, name, local_time(resp.get("pause_until")),
                                            _round_s(resp.get("pause_remaining", 0))))


async def resume(rt) -> None:
    """The pause request without a time: the consumer delivers again."""
    a = rt.args
    js, stream, name, ci = await _load(rt)
    if not ci.get("paused"):
        raise CLIError("consumer is not paused")
    if not a.force and not prompt.confirm("Really resume Consumer %s > %s" % (stream, name),
                                          False):
        return
    resp = await js.request("CONSUMER.PAUSE.%s.%s" % (stream, name), None,
                            doing="could not resume Consumer %s > %s" % (stream, name))
    if resp.get("paused"):
        raise CLIError("pause request failed for an unknown reason")
    print("Consumer %s > %s was resumed while previously paused until %s"
          % (stream, name, _paused_until(ci)))
