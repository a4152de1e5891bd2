"""Operations: config reload (SIGHUP / --signal reload), lame duck mode, shutdown."""
import asyncio
import signal
import subprocess
import sys

import nats
import pytest

from conftest import settle, start_natsjs, start_reference
from helpers import run

TIMEOUT = 10
SIGNAL_CMD = [sys.executable, "-m", "natsjs", "--signal"]


def write(path, text):
    path.write_text(text)
    return str(path)


def reload_and_wait(server, pidfile, count):
    subprocess.run(SIGNAL_CMD + ["reload=%s" % pidfile], check=True, timeout=TIMEOUT)
    server.wait_for(__import__("re").compile(
        (r"(Reloaded server configuration[^\n]*\n[\s\S]*){%d}" % count).encode()))


PERMS = """
authorization { users = [
  { user: pub, password: p, permissions: { publish: %s } }
  { user: other, password: o }
] }
"""


def test_reload_changes_permissions_live(tmp_path):
    conf = write(tmp_path / "s.conf", PERMS % '"allowed.>"')
    pidfile = str(tmp_path / "s.pid")
    server = start_natsjs("-c", conf, "-P", pidfile)
    try:
        async def main():
            errors = []

            async def on_error(e):
                errors.append(str(e).lower())
            pub = await nats.connect(server.url, user="pub", password="p", error_cb=on_error,
                                     allow_reconnect=False)
            other = await nats.connect(server.url, user="other", password="o",
                                       allow_reconnect=False)
            sub = await other.subscribe(">")
            await settle(other)
            await pub.publish("later.x", b"denied")
            await pub.publish("allowed.x", b"ok")
            await pub.flush()
            assert (await sub.next_msg(timeout=TIMEOUT)).subject == "allowed.x"
            assert any("permissions violation" in e for e in errors)

            write(tmp_path / "s.conf", PERMS % '["allowed.>", "later.>"]')
            reload_and_wait(server, pidfile, 1)
            await pub.publish("later.x", b"now allowed")
            await pub.flush()
            assert (await sub.next_msg(timeout=TIMEOUT)).subject == "later.x"
            assert pub.is_connected and other.is_connected      # nobody was dropped

            # A user removed from the file is disconnected; the others stay.
            write(tmp_path / "s.conf",
                  'authorization { users = [ { user: other, password: o } ] }\n')
            reload_and_wait(server, pidfile, 2)
            for _ in range(100):
                if pub.is_closed:
                    break
                await asyncio.sleep(0.02)
            assert pub.is_closed
            await other.flush()
            assert other.is_connected
            await other.close()
        run(main())
    finally:
        server.stop()


def test_bad_config_on_reload_keeps_the_running_server(tmp_path):
    conf = write(tmp_path / "s.conf", "port: -1\n")
    pidfile = str(tmp_path / "s.pid")
    server = start_natsjs("-c", conf, "-P", pidfile)
    try:
        write(tmp_path / "s.conf", "port: -1\nauthorization { users = [ }\n")
        subprocess.run(SIGNAL_CMD + ["reload=%s" % pidfile], check=True, timeout=TIMEOUT)
        server.wait_for(__import__("re").compile(rb"Failed to reload server configuration"))
        assert server.alive()

        async def main():
            nc = await nats.connect(server.url, allow_reconnect=False)
            await nc.flush()
            await nc.close()
        run(main())
    finally:
        server.stop()


def test_unknown_field_is_refused_like_the_reference(tmp_path):
    conf = write(tmp_path / "u.conf", "port: 4222\nfoo_bar: 1\n")
    ours = subprocess.run([sys.executable, "-m", "natsjs", "-c", conf], capture_output=True,
                          text=True, timeout=TIMEOUT)
    from conftest import reference_server_binary
    ref = subprocess.run([reference_server_binary(), "-c", conf], capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert ours.returncode != 0 and ref.returncode != 0
    expected = '%s:2:1: unknown field "foo_bar"' % conf
    assert expected in ours.stderr
    assert expected in ref.stderr


@pytest.mark.parametrize("kind", ["natsjs", "reference"])
def test_lame_duck_moves_clients_to_another_server(tmp_path, kind):
    conf = write(tmp_path / "ldm.conf", "lame_duck_duration: 30s\nlame_duck_grace_period: 1s\n")
    start = start_natsjs if kind == "natsjs" else start_reference
    duck = start("-c", conf)
    other = start_natsjs()
    try:
        async def main():
            moved = asyncio.Event()

            async def on_reconnect():
                moved.set()
            nc = await nats.connect(servers=[duck.url, other.url], dont_randomize=True,
                                    reconnect_time_wait=0.05, max_reconnect_attempts=100,
                                    reconnected_cb=on_reconnect)
            assert nc.connected_url.port == duck.port
            duck.proc.send_signal(signal.SIGUSR2)
            duck.wait_for(__import__("re").compile(rb"[Ll]ame duck mode"))
            await asyncio.wait_for(moved.wait(), TIMEOUT)
            assert nc.connected_url.port == other.port
            sub = await nc.subscribe("after.ldm")
            await nc.publish("after.ldm", b"still here")
            assert (await sub.next_msg(timeout=TIMEOUT)).data == b"still here"
            await nc.close()
        run(main())
        assert duck.proc.wait(TIMEOUT) == 0        # it shut itself down afterwards
    finally:
        duck.stop()
        other.stop()


def test_lame_duck_info_and_no_new_clients(tmp_path):
    import socket
    conf = write(tmp_path / "ldm.conf", "lame_duck_duration: 30s\nlame_duck_grace_period: 2s\n")
    server = start_natsjs("-c", conf)
    try:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        s.recv(4096)
        s.sendall(b'CONNECT {"verbose":false,"protocol":1}\r\nPING\r\n')
        buf = b""
        while buf.count(b"\r\n") < 2:          # PONG and the connect_info INFO
            buf += s.recv(4096)
        server.proc.send_signal(signal.SIGUSR2)
        data = b""
        while b'"ldm":true' not in data:
            chunk = s.recv(4096)
            assert chunk, data
            data += chunk
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=1).recv(1)
        s.close()
    finally:
        server.stop()


def test_sigterm_is_graceful(natsjs_server):
    server = natsjs_server()

    async def main():
        nc = await nats.connect(server.url, allow_reconnect=False)
        await nc.flush()
        server.proc.send_signal(signal.SIGTERM)
        assert await asyncio.get_running_loop().run_in_executor(None, server.proc.wait, 10) == 0
        for _ in range(100):
            if not nc.is_connected:
                break
            await asyncio.sleep(0.02)
        assert not nc.is_connected
        await nc.close()
    run(main())
    assert "Server Exiting" in server.text()


JS_CLUSTER_DOC = """server_name=n1-c1
listen=4222

jetstream {
   store_dir=/nats/storage
}

cluster {
  name: C1
  listen: 0.0.0.0:6222
  routes: [
    nats-route://host_b:6222
    nats-route://host_c:6222
  ]
}
"""

SYS_ADMIN_DOC = JS_CLUSTER_DOC + """
accounts {
  $SYS {
    users = [
      { user: "admin",
        pass: "$2a$11$PWIFAL8RsWyGI3jVZtO9Nu8.6jOxzxfZo7c/W0eLk017hjgUKWrhy"
      }
    ]
  }
}
"""


@pytest.mark.parametrize("text", [JS_CLUSTER_DOC, SYS_ADMIN_DOC], ids=["cluster", "sys-admin"])
def test_jetstream_clustering_documentation_configs_load(tmp_path, text):
    """The documentation's three-node configurations load as written (-t checks them)."""
    from conftest import reference_server_binary
    path = write(tmp_path / "n1.conf", text)
    ours = subprocess.run([sys.executable, "-m", "natsjs", "-t", "-c", path],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert ours.returncode == 0, ours.stderr
    ref = subprocess.run([reference_server_binary(), "-t", "-c", path], capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert ref.returncode == 0, ref.stderr
    from natsjs.config import load_config
    opts = load_config(path)
    assert opts.server_name == "n1-c1" and opts.port == 4222
    assert opts.cluster.name == "C1" and opts.cluster.port == 6222
    assert opts.cluster.routes == ("nats-route://host_b:6222", "nats-route://host_c:6222")


def test_jetstream_enabled_by_flags_and_config(tmp_path):
    conf = write(tmp_path / "js.conf", "jetstream { store_dir: %s }\n" % (tmp_path / "js"))
    for args in (["-js", "-sd", str(tmp_path / "js")], ["-c", conf]):
        s = start_natsjs(*args)
        try:
            s.wait_for(__import__("re").compile(rb"Store Directory: .*js/jetstream"))

            async def main():
                nc = await nats.connect(s.url, allow_reconnect=False)
                resp = await nc.request("$JS.API.INFO", b"", timeout=TIMEOUT)
                assert b"account_info_response" in resp.data
                await nc.close()
            run(main())
        finally:
            s.stop()
