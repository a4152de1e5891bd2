"""``natsjs stream ...``: natscli's stream commands over the JetStream API.

``add`` asks for what its flags leave out (``--defaults`` takes the defaults), ``info``
prints the screen the documentation shows -- the configuration, then ``Cluster
Information`` (``Replica: n4-c1, current, seen 0.07s ago``), then the state -- and
``report`` the placement table (``n1-c1*, n2-c1, n3-c1``).  ``cluster step-down`` and
``cluster peer-remove`` print the documentation's log lines.  Backups live in
``backup``.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import difflib
import json
import re
import sys

from natsjs.admin import prompt
from natsjs.admin.args import (duration_arg, int_arg, json_flag, load_config_file, metadata_arg,
                               size_arg)
from natsjs.admin.errors import APIError, CLIError, q
from natsjs.admin.render import (Columns, Table, duration, emit, go_duration, ibytes, local_rfc3339,
                                 local_time, log, print_json, seconds2, since)

MAX_INT64 = (1 << 63) - 1


def register(top):
    """The ``stream`` group and its own commands; ``app`` adds backup's and
    streamquery's to the group it returns, then ``register_cluster``'s."""
    g = top.group("stream", "JetStream stream management",
                  aliases=["str", "st", "ms", "s"])

    p = g.command("add", "Create a new stream", add, aliases=["create", "new"])
    p.add_argument("stream", nargs="?", help="Stream name")
    config_flags(p, edit=False)
    p.add_argument("--config", help="JSON file to read configuration from")
    p.add_argument("--defaults", action="store_true", help="Accept default values for all prompts")
    p.add_argument("--output", help="Save configuration instead of creating")

    p = g.command("ls", "List all known streams", ls, aliases=["list", "l"])
    p.add_argument("--subject", default="", help="Limit the list to streams with matching subjects")
    p.add_argument("-n", "--names", action="store_true", help="Show just the stream names")
    p.add_argument("-a", "--all", action="store_true", help="Include system streams")
    json_flag(p)

    p = g.command("report", "Reports on stream statistics", report)
    p.add_argument("--subject", default="", help="Limit the report to streams with matching subjects")
    p.add_argument("--cluster", default="", help="Limit report to streams within a specific cluster")
    p.add_argument("-o", "--consumers", action="store_true", help="Sort by number of Consumers")
    p.add_argument("-m", "--messages", action="store_true", help="Sort by number of Messages")
    p.add_argument("-n", "--name", action="store_true", help="Sort by stream name")
    p.add_argument("-t", "--storage", action="store_true", help="Sort by Storage type")
    p.add_argument("-r", "--raw", action="store_true", help="Show un-formatted numbers")
    json_flag(p)

    p = g.command("info", "Stream information", info, aliases=["nfo", "i"])
    p.add_argument("stream", nargs="?", help="Stream to retrieve information for")
    p.add_argument("--state", action="store_true", help="Shows only the stream state")
    json_flag(p)

    p = g.command("state", "Stream state", state)
    p.add_argument("stream", nargs="?", help="Stream to retrieve state information for")
    json_flag(p)

    p = g.command("edit", "Edits an existing stream", edit, aliases=["update"])
    p.add_argument("stream", nargs="?", help="Stream to edit")
    config_flags(p, edit=True)
    p.add_argument("--config", help="JSON file to read configuration from")
    p.add_argument("-f", "--force", action="store_true", help="Force edit without prompting")
    p.add_argument("--dry-run", action="store_true", help="Only shows differences")

    p = g.command("rm", "Removes a stream", rm, aliases=["delete", "del"])
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("-f", "--force", action="store_true", help="Force removal without prompting")

    p = g.command("purge", "Bulk removes messages from a stream", purge)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("-f", "--force", action="store_true", help="Force removal without prompting")
    p.add_argument("--subject", default="", help="Limits the purge to a specific subject")
    p.add_argument("--seq", type=int, default=0, help="Purge up to but not including a sequence")
    p.add_argument("--keep", type=int, default=0, help="Keeps a certain number of messages")
    json_flag(p)

    p = g.command("rmm", "Securely removes an individual message from a stream", rmm)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("id", nargs="?", type=int, help="Message Sequence to remove")
    p.add_argument("-f", "--force", action="store_true", help="Force removal without prompting")

    p = g.command("get", "Retrieves a specific message from a Stream", get)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("id", nargs="?", type=int, help="Message Sequence to retrieve")
    p.add_argument("-S", "--last-for", dest="last_for", default="",
                   help="Retrieves the message for a specific subject")
    json_flag(p)

    p = g.command("view", "View messages in a stream", view)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("size", nargs="?", type=int, default=10, help="Page size")
    p.add_argument("--id", type=int, default=0, help="Start at a specific message Sequence")
    p.add_argument("--since", default="", help="Messages received since a duration like 1d3h5m2s")
    p.add_argument("--raw", action="store_true", help="Show the raw data received")
    p.add_argument("--subject", default="", help="Filter the stream using a subject")

    p = g.command("seal", "Seals a stream preventing further updates", seal)
    p.add_argument("stream", nargs="?", help="Stream name")
    p.add_argument("-f", "--force", action="store_true", help="Force sealing without prompting")

    p = g.command("copy", "Creates a new stream based on the configuration of another", copy,
                  aliases=["cp"])
    p.add_argument("source", help="Source Stream to copy")
    p.add_argument("destination", help="New Stream to create")
    config_flags(p, edit=True)
    return g


def register_cluster(g) -> None:
    c = g.group("cluster", "Manages a clustered stream", aliases=["c"])
    p = c.command("step-down", "Force a new leader election by standing down the current "
                  "leader", step_down, aliases=["stepdown", "sd", "elect", "down", "d"])
    p.add_argument("stream", nargs="?", help="Stream to act on")
    p.add_argument("--preferred", default="", help="Prefer placing the leader on a specific host")
    p.add_argument("-f", "--force", action="store_true", help="Force leader step down")
    p = c.command("peer-remove", "Removes a peer from the stream cluster", peer_remove,
                  aliases=["pr"])
    p.add_argument("stream", nargs="?", help="The stream to act on")
    p.add_argument("peer", nargs="?", help="The name of the peer to remove")
    p.add_argument("-f", "--force", action="store_true", help="Force removal without prompting")


# ---- configuration from flags and prompts -------------------------------------------------


def _split_subjects(values) -> list[str]:
    out = []
    for v in values or []:
        out.extend(s for s in re.split(r"[,\s]+", v) if s)
    return out


def config_flags(p, edit: bool) -> None:
    b = argparse.BooleanOptionalAction
    p.add_argument("--subjects", action="append", help="Subjects that are consumed by the stream")
    p.add_argument("--description", default="", help="Sets a contextual description")
    p.add_argument("--storage", choices=["file", "f", "memory", "m"], help="Storage backend")
    p.add_argument("--compression", choices=["none", "s2"], help="Compression (file storage)")
    p.add_argument("--replicas", type=int, default=0, help="When clustered, how many replicas")
    p.add_argument("--tag", action="append", help="Place the stream on servers with this tag")
    p.add_argument("--cluster", default=None, help="Place the stream on a specific cluster")
    p.add_argument("--ack", action=b, default=None, help="Acknowledge publishes")
    p.add_argument("--retention", choices=["limits", "interest", "workq", "work"],
                   help="Retention policy")
    p.add_argument("--discard", choices=["new", "old"], help="Discard policy")
    p.add_argument("--discard-per-subject", action=b, default=None,
                   help="Apply the 'new' discard policy to every subject")
    p.add_argument("--max-age", default="", help="Maximum age of messages to keep")
    p.add_argument("--max-bytes", default="", help="Maximum bytes to keep")
    p.add_argument("--max-consumers", type=int, default=None, help="Maximum consumers")
    p.add_argument("--max-msg-size", default="", help="Maximum size any 1 message may be")
    p.add_argument("--max-msgs", type=int, default=0, help="Maximum amount of messages")
    p.add_argument("--max-msgs-per-subject", type=int, default=0,
                   help="Maximum amount of messages per subject")
    p.add_argument("--dupe-window", default="", help="Duplicate message tracking window")
    p.add_argument("--allow-rollup", action=b, default=None, help="Allow roll-up headers")
    p.add_argument("--deny-delete", action=b, default=None, help="Deny message deletes")
    p.add_argument("--deny-purge", action=b, default=None, help="Deny purges")
    p.add_argument("--allow-direct", action=b, default=None, help="Allow direct get")
    p.add_argument("--allow-mirror-direct", action=b, default=None,
                   help="Allow direct get on mirrors")
    p.add_argument("--allow-msg-ttl", action="store_true", default=None,
                   help="Allow per-message TTL")
    p.add_argument("--transform-source", default="", help="Stream subject transform source")
    p.add_argument("--transform-destination", default="",
                   help="Stream subject transform destination")
    p.add_argument("--republish-source", default="", help="Republish messages from this subject")
    p.add_argument("--republish-destination", default="", help="Republish destination")
    p.add_argument("--republish-headers", action="store_true", help="Republish only headers")
    p.add_argument("--metadata", action="append", help="Adds metadata KEY=VALUE")
    if not edit:
        p.add_argument("--mirror", default="", help="Completely mirror another stream")
        p.add_argument("--source", action="append", help="Source data from other streams")
        p.add_argument("--first-sequence", type=int, default=0, help="The starting sequence")
    json_flag(p)


_RETENTION = {"limits": "limits", "interest": "interest", "workq": "workqueue",
              "work": "workqueue", "work queue": "workqueue"}
_STORAGE = {"file": "file", "f": "file", "memory": "memory", "m": "memory"}


def _apply_common(cfg: dict, a) -> None:
    """Flags that mean the same for add and edit; only what was given changes."""
    if a.description:
        cfg["description"] = a.description
    if a.subjects:
        cfg["subjects"] = _split_subjects(a.subjects)
    if a.storage:
        cfg["storage"] = _STORAGE[a.storage]
    if a.compression:
        cfg["compression"] = a.compression
    if a.replicas:
        cfg["num_replicas"] = a.replicas
    if a.ack is not None:
        cfg["no_ack"] = not a.ack
    if a.retention:
        cfg["retention"] = _RETENTION[a.retention]
    if a.discard:
        cfg["discard"] = a.discard
    if a.discard_per_subject is not None:
        cfg["discard_new_per_subject"] = a.discard_per_subject
        if a.discard_per_subject:
            cfg["discard"] = "new"
    if a.max_age:
        cfg["max_age"] = duration_arg(a.max_age, "maximum age")
    if a.max_bytes:
        cfg["max_bytes"] = size_arg(a.max_bytes, "maximum bytes")
    if a.max_consumers is not None:
        cfg["max_consumers"] = a.max_consumers
    if a.max_msg_size:
        cfg["max_msg_size"] = size_arg(a.max_msg_size, "maximum message size")
    if a.max_msgs:
        cfg["max_msgs"] = a.max_msgs
    if a.max_msgs_per_subject:
        cfg["max_msgs_per_subject"] = a.max_msgs_per_subject
    if a.dupe_window:
        cfg["duplicate_window"] = duration_arg(a.dupe_window, "duplicate window")
    for flag, key, invert in (("allow_rollup", "allow_rollup_hdrs", False),
                              ("deny_delete", "deny_delete", False),
                              ("deny_purge", "deny_purge", False),
                              ("allow_direct", "allow_direct", False),
                              ("allow_mirror_direct", "mirror_direct", False),
                              ("allow_msg_ttl", "allow_msg_ttl", False)):
        v = getattr(a, flag)
        if v is not None:
            cfg[key] = (not v) if invert else v
    if a.tag is not None or a.cluster is not None:
        placement = dict(cfg.get("placement") or {})
        if a.cluster is not None:
            placement["cluster"] = a.cluster
        if a.tag is not None:
            placement["tags"] = [t for t in a.tag if t]
        placement = {k: v for k, v in placement.items() if v}
        if placement:
            cfg["placement"] = placement
        else:
            cfg.pop("placement", None)
    if a.transform_source or a.transform_destination:
        cfg["subject_transform"] = {"src": a.transform_source or ">",
                                    "dest": a.transform_destination}
    if a.republish_source and a.republish_destination:
        cfg["republish"] = {"src": a.republish_source, "dest": a.republish_destination}
        if a.republish_headers:
            cfg["republish"]["headers_only"] = True
    elif a.republish_source or a.republish_destination:
        raise CLIError("both --republish-source and --republish-destination are required")
    if a.metadata:
        cfg["metadata"] = metadata_arg(a.metadata)


def prepare_config(a) -> dict:
    """The new stream's configuration: --config, else flags, prompting for the rest as
    natscli does (Storage, Replication, Retention Policy, Discard Policy, limits,
    duplicate window, roll-ups, deletes, purges)."""
    if a.config:
        cfg = load_config_file(a.config)
        if a.stream:
            cfg["name"] = a.stream
        if not cfg.get("name"):
            raise CLIError("the configuration has no stream name")
        _apply_common(cfg, a)
        return cfg
    name = a.stream or prompt.ask("Stream Name", required=True, flag="a stream name")
    a.stream = name
    cfg: dict = {"name": name}
    d = a.defaults
    if a.mirror:
        cfg["mirror"] = _source(a.mirror)
        if a.subjects:
            raise CLIError("mirrors cannot listen for messages on subjects")
    if a.source:
        cfg["sources"] = [_source(s) for s in a.source]
    if not a.mirror and not a.source and not a.subjects:
        answer = prompt.ask("Subjects", default=name if d else None, required=not d,
                            flag="--subjects")
        a.subjects = [answer] if answer else None
    storage = a.storage or ("file" if d else prompt.select(
        "Storage", ["file", "memory"], default="file", flag="--storage"))
    replicas = a.replicas or (1 if d else int_arg(prompt.ask(
        "Replication", default="1", flag="--replicas"), "replicas"))
    if replicas <= 0:
        raise CLIError("replicas should be >= 1")
    retention = a.retention or ("limits" if d else prompt.select(
        "Retention Policy", ["Limits", "Interest", "Work Queue"], default="Limits",
        flag="--retention").lower())
    discard = a.discard or ("old" if d else prompt.select(
        "Discard Policy", ["New", "Old"], default="Old", flag="--discard").lower())
    max_msgs = a.max_msgs or (-1 if d else int_arg(prompt.ask(
        "Stream Messages Limit", default="-1", flag="--max-msgs"), "messages limit"))
    per_subject = a.max_msgs_per_subject or (-1 if d else int_arg(prompt.ask(
        "Per Subject Messages Limit", default="-1", flag="--max-msgs-per-subject"),
        "per subject limit"))
    max_bytes = size_arg(a.max_bytes or ("-1" if d else prompt.ask(
        "Total Stream Size", default="-1", flag="--max-bytes")), "stream size")
    max_age = duration_arg(a.max_age or ("-1" if d else prompt.ask(
        "Message TTL", default="-1", flag="--max-age")), "maximum age")
    max_msg_size = size_arg(a.max_msg_size or ("-1" if d else prompt.ask(
        "Max Message Size", default="-1", flag="--max-msg-size")), "maximum message size")
    dupe_default = "2m0s" if not (0 < max_age < 120 * 10 ** 9) else go_duration(max_age)
    dupe = 0
    if not a.mirror:
        dupe = duration_arg(a.dupe_window or (dupe_default if d else prompt.ask(
            "Duplicate tracking time window", default=dupe_default, flag="--dupe-window")),
            "duplicate window")
    if not d:
        if a.allow_rollup is None:
            a.allow_rollup = prompt.confirm("Allow message Roll-ups", False)
        if a.deny_delete is None:
            a.deny_delete = not prompt.confirm("Allow message deletion", True)
        if a.deny_purge is None:
            a.deny_purge = not prompt.confirm("Allow purging subjects or the entire stream",
                                              True)
    cfg.update({
        "retention": _RETENTION[retention], "max_consumers": -1,
        "max_msgs": max_msgs if max_msgs > 0 else -1,
        "max_bytes": max_bytes if max_bytes > 0 else -1,
        "max_age": max_age,
        "max_msgs_per_subject": per_subject if per_subject > 0 else -1,
        "max_msg_size": max_msg_size if max_msg_size > 0 else -1,
        "discard": discard, "storage": _STORAGE[storage], "num_replicas": replicas,
        "duplicate_window": dupe, "allow_direct": True,
    })
    if a.first_sequence:
        cfg["first_seq"] = a.first_sequence
    # the flags prompts do not cover (description, placement, metadata...); the
    # prompted ones apply again unchanged
    _apply_common(cfg, a)
    return cfg


def _source(text: str) -> dict:
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError as e:
            raise CLIError("invalid source %s: %s" % (q(text), e)) from None
    return {"name": text}


# ---- picking a stream ---------------------------------------------------------------------


def is_internal(name: str) -> bool:
    """KV buckets and object stores (jsm.go IsInternalStream)."""
    return name.startswith(("KV_", "OBJ_"))


async def pick_stream(rt, name: str | None, show_all: bool = False) -> str:
    if name:
        return name
    js = await rt.js()
    names = [n for n in await js.stream_names() if show_all or not is_internal(n)]
    if not names:
        raise CLIError("no Streams are defined")
    if len(names) == 1:
        return names[0]
    return prompt.select("Select a Stream", names, flag="a stream name")


# ---- showing a stream ---------------------------------------------------------------------


def _limit(value, unlimited, fmt=None):
    if value in (None, -1) or (unlimited == 0 and not value):
        return "unlimited"
    return fmt(value) if fmt else value


def _source_text(s: dict | None) -> str:
    if not s:
        return ""
    parts = [s.get("name", "")]
    if s.get("opt_start_seq"):
        parts.append("Start Seq: %s" % "{:,}".format(s["opt_start_seq"]))
    if s.get("opt_start_time"):
        parts.append("Start Time: %s" % s["opt_start_time"])
    if s.get("filter_subject"):
        parts.append("Subject: %s" % s["filter_subject"])
    ext = s.get("external") or {}
    if ext.get("api"):
        parts.append("API Prefix: %s" % ext["api"])
    if ext.get("deliver"):
        parts.append("Delivery Prefix: %s" % ext["deliver"])
    return ", ".join(parts)


def replica_state(r: dict) -> str:
    """'n4-c1, current, seen 0.07s ago' as the documentation prints a replica."""
    state = [r.get("name", ""), "current" if r.get("current") else "outdated"]
    if r.get("offline"):
        state.append("OFFLINE")
    active = r.get("active") or 0
    if 0 < active < MAX_INT64:
        state.append("seen %s ago" % seconds2(active))
    else:
        state.append("not seen")
    lag = r.get("lag") or 0
    if lag > 1:
        state.append("%s operations behind" % "{:,}".format(lag))
    elif lag == 1:
        state.append("1 operation behind")
    return ", ".join(state)


def add_cluster_block(c: Columns, cluster: dict | None) -> None:
    if not cluster or not cluster.get("name"):
        return
    c.title("Cluster Information")
    c.row("Name", cluster["name"])
    c.row("Leader", cluster.get("leader", ""))
    for r in cluster.get("replicas") or []:
        c.row("Replica", replica_state(r))


def show_config(c: Columns, cfg: dict) -> None:
    c.title("Configuration")
    c.row_nonempty("Description", cfg.get("description"))
    c.row_if("Subjects", cfg.get("subjects") or [], cfg.get("subjects"))
    c.row("Replicas", cfg.get("num_replicas", 1))
    c.row_if("Sealed", True, cfg.get("sealed"))
    c.row("Storage", (cfg.get("storage") or "file").capitalize())
    c.row_if("Compression", cfg.get("compression"), cfg.get("compression") not in (None, "none"))
    if cfg.get("first_seq"):
        c.row("First Sequence", cfg["first_seq"])
    placement = cfg.get("placement") or {}
    c.row_nonempty("Placement Cluster", placement.get("cluster"))
    c.row_if("Placement Tags", placement.get("tags"), placement.get("tags"))
    st = cfg.get("subject_transform") or {}
    if st.get("dest"):
        c.row("Subject Transform", "%s to %s" % (st.get("src") or ">", st["dest"]))
    rp = cfg.get("republish")
    if rp:
        c.row("Republishing" + (" Headers" if rp.get("headers_only") else ""),
              "%s to %s" % (rp.get("src"), rp.get("dest")))
    retention = {"limits": "Limits", "interest": "Interest",
                 "workqueue": "WorkQueue"}.get(cfg.get("retention", "limits"), "Limits")
    c.row("Retention", retention)
    c.row("Acknowledgments", not cfg.get("no_ack", False))
    discard = "New Per Subject" if cfg.get("discard_new_per_subject") else \
        (cfg.get("discard") or "old").capitalize()
    c.row("Discard Policy", discard)
    c.row("Duplicate Window", duration(cfg.get("duplicate_window") or 0))
    c.row_if("Direct Get", True, cfg.get("allow_direct"))
    c.row_if("Mirror Direct Get", True, cfg.get("mirror_direct"))
    c.row("Allows Msg Delete", not cfg.get("deny_delete", False))
    c.row("Allows Purge", not cfg.get("deny_purge", False))
    c.row("Allows Rollups", bool(cfg.get("allow_rollup_hdrs")))
    c.row_if("Allows Msg TTL", True, cfg.get("allow_msg_ttl"))
    c.row("Maximum Messages", _limit(cfg.get("max_msgs", -1), -1))
    mps = cfg.get("max_msgs_per_subject", -1)
    c.row("Maximum Per Subject", "unlimited" if (mps or 0) <= 0 else mps)
    c.row("Maximum Bytes", _limit(cfg.get("max_bytes", -1), -1, ibytes))
    age = cfg.get("max_age") or 0
    c.row("Maximum Age", "unlimited" if age <= 0 else duration(age))
    c.row("Maximum Message Size", _limit(cfg.get("max_msg_size", -1), -1, ibytes))
    c.row("Maximum Consumers", _limit(cfg.get("max_consumers", -1), -1))
    meta = {k: v for k, v in (cfg.get("metadata") or {}).items()
            if not k.startswith("_nats")}
    for k in sorted(meta):
        c.row("Metadata" if k == sorted(meta)[0] else "", "%s: %s" % (k, meta[k]))
    c.row_nonempty("Mirror", _source_text(cfg.get("mirror")))
    for i, s in enumerate(sorted(cfg.get("sources") or [], key=lambda s: s.get("name", ""))):
        c.row("Sources" if i == 0 else "", _source_text(s))


def _source_info(c: Columns, s: dict) -> None:
    c.row("Stream Name", s.get("name", ""))
    if s.get("filter_subject"):
        c.row("Subject Filter", s["filter_subject"])
    for i, t in enumerate(s.get("subject_transforms") or []):
        label = "Subject Filter" if i == 0 else ""
        c.row(label, "%s to %s" % (t.get("src"), t.get("dest")) if t.get("dest")
              else "%s untransformed" % t.get("src"))
    c.row("Lag", s.get("lag", 0))
    active = s.get("active", -1)
    c.row("Last Seen", duration(active) if 0 < active < MAX_INT64 else "never")
    ext = s.get("external") or {}
    if ext.get("api"):
        c.row("Ext. API Prefix", ext["api"])
    if s.get("error"):
        c.row("Error", (s["error"] or {}).get("description", ""))


def stream_screen(info: dict, state_only: bool = False) -> Columns:
    cfg = info.get("config") or {}
    name = cfg.get("name", "")
    heading = "%s for Stream %s created %s" % ("State" if state_only else "Information", name,
                                              local_rfc3339(info.get("created")))
    c = Columns(heading)
    if not state_only:
        show_config(c, cfg)
    add_cluster_block(c, info.get("cluster"))
    if info.get("mirror"):
        c.title("Mirror Information")
        _source_info(c, info["mirror"])
    for s in info.get("sources") or []:
        c.title("Source Information")
        _source_info(c, s)
    st = info.get("state") or {}
    c.title("State")
    c.row("Messages", st.get("messages", 0))
    c.row("Bytes", ibytes(st.get("bytes", 0)))
    first_t, last_t = local_time(st.get("first_ts")), local_time(st.get("last_ts"))
    c.row("First Sequence", "%s @ %s" % ("{:,}".format(st.get("first_seq", 0)), first_t)
          if first_t else st.get("first_seq", 0))
    c.row("Last Sequence", "%s @ %s" % ("{:,}".format(st.get("last_seq", 0)), last_t)
          if last_t else st.get("last_seq", 0))
    deleted = st.get("num_deleted") or len(st.get("deleted") or [])
    c.row_if("Deleted Messages", deleted, deleted)
    c.row("Active Consumers", st.get("consumer_count", 0))
    c.row_if("Number of Subjects", st.get("num_subjects", 0), st.get("num_subjects"))
    return c


def show_stream(info: dict, as_json: bool = False, state_only: bool = False) -> None:
    emit(info, as_json, lambda v: stream_screen(v, state_only))


# ---- commands -----------------------------------------------------------------------------


async def add(rt) -> None:
    a = rt.args
    cfg = prepare_config(a)
    if a.output:
        save_config(a.output, cfg)
        return
    js = await rt.js()
    info = await js.request("STREAM.CREATE." + cfg["name"], cfg, doing="could not create Stream")
    if a.json:
        print_json(info)
        return
    print("Stream %s was created\n" % cfg["name"])
    show_stream(info)
    print()


async def info(rt) -> None:
    name = await pick_stream(rt, rt.args.stream)
    js = await rt.js()
    data = await js.request("STREAM.INFO." + name, None,
                            doing="could not request Stream info")
    show_stream(data, rt.args.json, getattr(rt.args, "state", False))
    if not rt.args.json:
        print()


async def state(rt) -> None:
    rt.args.state = True
    await info(rt)


async def ls(rt) -> None:
    a = rt.args
    js = await rt.js()
    if a.names:
        names = await js.stream_names(a.subject)
        names = [n for n in names if a.all or not is_internal(n)]
        if a.json:
            print_json(names)
        else:
            for n in names:
                print(n)
        return
    body = {"subject": a.subject} if a.subject else None
    infos, last = await js.paged("STREAM.LIST", "streams", body)
    skipped = any(is_internal(i["config"]["name"]) for i in infos)
    infos = [i for i in infos if a.all or not is_internal(i["config"]["name"])]
    if a.json:
        print_json(sorted(i["config"]["name"] for i in infos))
        return
    if not infos and not last.get("missing"):
        print("No Streams defined" + (", pass -a to include system streams" if skipped else ""))
        return
    streams_table(infos, a.subject)
    _show_missing(last)


def streams_table(infos: list, subject: str = "") -> None:
    """natscli's renderStreamsAsTable: smallest first, with the last message's age."""
    infos = sorted(infos, key=lambda i: (i.get("state") or {}).get("bytes", 0))
    t = Table("Streams" if not subject else "Streams matching %s" % subject,
              ["Name", "Description", "Created", "Messages", "Size", "Last Message"])
    for i in infos:
        st = i.get("state") or {}
        last_ts = st.get("last_ts")
        t.add(i["config"]["name"], i["config"].get("description", ""),
              local_time(i.get("created")), st.get("messages", 0), ibytes(st.get("bytes", 0)),
              duration(since(last_ts)) if local_time(last_ts) else "never")
    t.print()


def _show_missing(last: dict) -> None:
    """Streams the listing could not reach (the ``missing`` of STREAM.LIST)."""
    missing = last.get("missing") or []
    if missing:
        print()
        t = Table("Inaccessible Streams")
        for n in sorted(missing):
            t.add(n)
        t.print()


def render_cluster(cluster: dict | None) -> str:
    """The report's placement cell: leader starred, lagging or offline peers marked '!'."""
    if not cluster:
        return ""
    names = []
    if cluster.get("leader"):
        names.append(cluster["leader"] + "*")
    for r in cluster.get("replicas") or []:
        names.append(r.get("name", "") + ("!" if r.get("offline") or not r.get("current")
                                           else ""))
    return ", ".join(sorted(names))


async def report(rt) -> None:
    a = rt.args
    js = await rt.js()
    if not a.json:
        print("Obtaining Stream stats")
    body = {"subject": a.subject} if a.subject else None
    infos, last = await js.paged("STREAM.LIST", "streams", body)
    stats = []
    for i in infos:
        cl = i.get("cluster") or {}
        if a.cluster and cl.get("name") != a.cluster:
            continue
        st = i.get("state") or {}
        lost = st.get("lost") or {}
        stats.append({
            "name": i["config"]["name"], "consumers": st.get("consumer_count", 0),
            "msgs": st.get("messages", 0), "bytes": st.get("bytes", 0),
            "storage": (i["config"].get("storage") or "file").capitalize(),
            "lost_msgs": len(lost.get("msgs") or []), "lost_bytes": lost.get("bytes", 0),
            "deleted": st.get("num_deleted") or len(st.get("deleted") or []),
            "replicas": i["config"].get("num_replicas", 1), "cluster": i.get("cluster"),
        })
    key = ("consumers" if a.consumers else "msgs" if a.messages else "name" if a.name
           else "storage" if a.storage else "bytes")
    stats.sort(key=lambda s: s[key])
    if a.json:
        print_json(stats)
        return
    if not stats:
        print("No Streams defined")
        return
    t = Table("", ["Stream", "Consumers", "Messages", "Bytes", "Storage", "Lost", "Deleted",
                   "Cluster"])
    for s in stats:
        if a.raw:
            lost = "%d (%d)" % (s["lost_msgs"], s["lost_bytes"]) if s["lost_msgs"] else "0"
            t.add(s["name"], str(s["consumers"]), str(s["msgs"]), str(s["bytes"]),
                  s["storage"], lost, str(s["deleted"]), render_cluster(s["cluster"]))
        else:
            lost = "%s (%s)" % ("{:,}".format(s["lost_msgs"]), ibytes(s["lost_bytes"])) \
                if s["lost_msgs"] else "0"
            t.add(s["name"], s["consumers"], s["msgs"], ibytes(s["bytes"]), s["storage"],
                  lost, s["deleted"], render_cluster(s["cluster"]))
    t.print()
    _show_missing(last)


async def rm(rt) -> None:
    a = rt.args
    if a.force and not a.stream:
        raise CLIError("--force requires a stream name")
    name = await pick_stream(rt, a.stream)
    if not a.force and not prompt.confirm("Really delete Stream %s" % name, False):
        return
    js = await rt.js()
    await js.request("STREAM.DELETE." + name, None, doing="could not remove Stream")


async def purge(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    if not a.force and not prompt.confirm("Really purge Stream %s" % name, False):
        return
    body = None
    if a.keep or a.subject or a.seq:
        if a.seq and a.keep:
            raise CLIError("sequence and keep cannot be combined when purging")
        body = {k: v for k, v in (("filter", a.subject), ("seq", a.seq), ("keep", a.keep)) if v}
    js = await rt.js()
    resp = await js.request("STREAM.PURGE." + name, body, doing="could not purge Stream")
    info_ = await js.request("STREAM.INFO." + name, None, doing="could not purge Stream")
    if a.json:
        print_json(info_)
        return
    print("Purged %d messages from %s\n" % (resp.get("purged", 0), name))
    show_stream(info_, state_only=True)
    print()


async def rmm(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    seq = a.id
    if seq is None:
        seq = int_arg(prompt.ask("Message Sequence to remove", required=True,
                              flag="a sequence"), "sequence")
    if seq <= 0:
        raise CLIError("positive message ID required")
    if not a.force and not prompt.confirm("Really remove message %d from Stream %s"
                                          % (seq, name), False):
        return
    js = await rt.js()
    await js.request("STREAM.MSG.DELETE." + name, {"seq": seq},
                     doing="could not remove message %d" % seq)


def decode_headers(raw: bytes) -> list[tuple[str, str]]:
    out = []
    lines = raw.decode(errors="replace").split("\r\n")
    for line in lines[1:]:
        if not line or ":" not in line:
            continue
        k, v = line.split(":", 1)
        out.append((k.strip(), v.strip()))
    return out


def print_body(data: bytes) -> None:
    """natscli's outPutMSGBody: the payload and a blank line ('nil body' if empty)."""
    if not data:
        print("nil body")
        print()
        return
    text = data.decode(errors="replace")
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    print()


async def get_message(js, stream: str, body: dict) -> dict:
    resp = await js.request("STREAM.MSG.GET." + stream, body,
                            doing="could not retrieve %s#%s" % (stream, body.get(
                                "seq", body.get("last_by_subj", ""))))
    return resp.get("message") or {}


async def get(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    seq, subject = a.id, a.last_for
    if seq is None and not subject:
        seq = int_arg(prompt.ask("Message Sequence to retrieve", default="-1",
                              flag="a sequence or --last-for"), "sequence")
        if seq == -1:
            seq = None
            subject = prompt.ask("Subject to retrieve last message for", required=True,
                                 flag="--last-for")
    js = await rt.js()
    msg = await get_message(js, name, {"seq": seq} if seq is not None
                            else {"last_by_subj": subject})
    if a.json:
        print_json(msg)
        return
    received = msg.get("time", "")
    print("Item: %s#%d received %s (%s) on Subject %s\n" % (
        name, msg.get("seq", 0), local_time(received), duration(since(received)),
        msg.get("subject", "")))
    hdrs = base64.b64decode(msg["hdrs"]) if msg.get("hdrs") else b""
    if hdrs:
        print("Headers:")
        for k, v in decode_headers(hdrs):
            print("  %s: %s" % (k, v))
        print()
    print_body(base64.b64decode(msg.get("data") or ""))


async def view(rt) -> None:
    """Pages through a stream with MSG.GET next_by_subj; on a terminal it asks before
    each further page, otherwise it prints to the end."""
    a = rt.args
    name = await pick_stream(rt, a.stream)
    js = await rt.js()
    info_ = await js.request("STREAM.INFO." + name, None, doing="could not load stream")
    seq = max(a.id, (info_.get("state") or {}).get("first_seq", 1), 1)
    if a.since:
        import datetime as dt
        start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(
            microseconds=duration_arg(a.since, "--since") / 1000)
        seq = None
        body_extra = {"start_time": start.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    else:
        body_extra = {}
    size = max(1, min(a.size, 25))
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    shown = 0
    while True:
        body = {"next_by_subj": a.subject or ">"}
        if seq is not None:
            body["seq"] = seq
        else:
            body.update(body_extra)
        try:
            msg = await get_message(js, name, body)
        except APIError as e:
            if e.err_code == 10037 or e.code_http == 404:
                log("Reached apparent end of data")
                return
            raise
        seq = msg.get("seq", 0) + 1
        data = base64.b64decode(msg.get("data") or "")
        if a.raw:
            print(data.decode(errors="replace"))
        else:
            print("[%d] Subject: %s Received: %s" % (msg.get("seq", 0), msg.get("subject", ""),
                                                     local_time(msg.get("time"))))
            hdrs = base64.b64decode(msg["hdrs"]) if msg.get("hdrs") else b""
            if hdrs:
                print()
                for k, v in decode_headers(hdrs):
                    print("  %s: %s" % (k, v))
            print()
            print_body(data)
        shown += 1
        if shown % size == 0 and tty and not prompt.confirm("Next Page?", True):
            return


async def seal(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    if not a.force and not prompt.confirm(
            "Really seal Stream %s, sealed streams can not be unsealed or modified" % name,
            False):
        return
    js = await rt.js()
    cfg = (await js.stream_info(name))["config"]
    cfg["sealed"] = True
    info_ = await js.request("STREAM.UPDATE." + name, cfg, doing="could not seal Stream")
    show_stream(info_)


def _diff(old: dict, new: dict) -> str:
    a = json.dumps(old, indent=2, sort_keys=True).splitlines()
    b = json.dumps(new, indent=2, sort_keys=True).splitlines()
    return "\n".join(line for line in difflib.unified_diff(a, b, "old", "new", lineterm="")
                     ) + "\n"


def edit_plan(current: dict, cfg: dict, a, question: str) -> int | None:
    """Show what an edit changes and ask; the exit code to stop with (0: nothing to do
    or declined, 1: --dry-run found differences), or None to go ahead."""
    if _normal(cfg) == _normal(current):
        if not a.dry_run:
            print("No difference in configuration")
        return 0
    print("Differences (-old +new):\n%s" % _diff(current, cfg))
    if a.dry_run:
        return 1
    if not a.force and not prompt.confirm(question, False):
        return 0
    return None


def save_config(path: str, cfg: dict) -> None:
    """``--output FILE``: the configuration that would have been sent."""
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def _normal(cfg: dict) -> dict:
    out = dict(cfg)
    if isinstance(out.get("subjects"), list):
        out["subjects"] = sorted(out["subjects"])
    return out


async def edit(rt) -> int:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    js = await rt.js()
    current = (await js.request("STREAM.INFO." + name, None,
                                doing="could not request Stream %s configuration"
                                % name))["config"]
    if a.config:
        cfg = load_config_file(a.config)
        cfg.setdefault("name", name)
    else:
        cfg = json.loads(json.dumps(current))
        _apply_common(cfg, a)
    go = edit_plan(current, cfg, a, "Really edit Stream %s" % name)
    if go is not None:
        return go
    info_ = await js.request("STREAM.UPDATE." + name, cfg,
                             doing="could not edit Stream %s" % name)
    if a.json:
        print_json(info_)
        return 0
    print("Stream %s was updated\n" % name)
    show_stream(info_)
    print()
    return 0


async def copy(rt) -> None:
    a = rt.args
    js = await rt.js()
    cfg = (await js.request("STREAM.INFO." + a.source, None,
                            doing="could not request Stream %s" % a.source))["config"]
    cfg["name"] = a.destination
    _apply_common(cfg, a)
    info_ = await js.request("STREAM.CREATE." + a.destination, cfg,
                             doing="could not create Stream")
    show_stream(info_, a.json)


async def leader_step_down(what: str, info: dict, load, stepdown, show,
                           force: bool) -> None:
    """A stream's or consumer's group elects another leader: log the documentation's
    'Requesting leader step down of "n1-c1" in a 3 peer RAFT group', ask, then poll
    the info every 500 ms (as natscli does) until it names a new leader."""
    cluster = info.get("cluster") or {}
    if not cluster.get("replicas"):
        raise CLIError("%s is not clustered" % what)
    leader = cluster.get("leader", "")
    if not leader and not force:
        raise CLIError("%s has no current leader" % what)
    leader = leader or "<unknown>"
    log("Requesting leader step down of %s in a %d peer RAFT group"
        % (q(leader), len(cluster["replicas"]) + 1))
    await stepdown()
    for _ in range(20):
        await asyncio.sleep(0.5)
        try:
            info = await load()
        except CLIError as e:
            log("Failed to retrieve %s state: %s" % (what, e))
            continue
        new = (info.get("cluster") or {}).get("leader", "")
        if not new:
            log("No leader elected")
        elif new != leader:
            log("New leader elected %s" % q(new))
            print()
            show(info)
            return
    raise CLIError("%s did not elect a new leader in time" % what)


async def step_down(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    js = await rt.js()
    info_ = await js.request("STREAM.INFO." + name, None, doing="could not load stream")
    body = {"placement": {"preferred": a.preferred}} if a.preferred else None
    await leader_step_down(
        "stream %s" % q(name), info_, lambda: js.request("STREAM.INFO." + name, None),
        lambda: js.request("STREAM.LEADER.STEPDOWN." + name, body,
                           doing="could not step down the leader of %s" % name),
        lambda i: (show_stream(i), print()), a.force)


async def peer_remove(rt) -> None:
    a = rt.args
    name = await pick_stream(rt, a.stream)
    js = await rt.js()
    info_ = await js.request("STREAM.INFO." + name, None, doing="could not load stream")
    cluster = info_.get("cluster")
    if not cluster:
        raise CLIError("stream %s is not clustered" % q(name))
    peers = ([cluster["leader"]] if cluster.get("leader") else []) + \
        [r["name"] for r in cluster.get("replicas") or []]
    if len(peers) == 1 and not a.force:
        raise CLIError("removing the only peer on a stream will result in data loss, use "
                       "--force to force")
    peer = a.peer or prompt.select("Select a Peer", peers, flag="the peer name")
    log("Removing peer %s" % q(peer))
    await js.request("STREAM.PEER.REMOVE." + name, {"peer": peer},
                     doing="could not remove peer %s" % q(peer))
    log("Requested removal of peer %s" % q(peer))
