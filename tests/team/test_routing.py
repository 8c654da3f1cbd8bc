"""The team server's router (rest_lsp/team/routing.py): a workspace stays on its replica, new ones go to the
emptiest, and its table stays bounded: workspaces unseen for a while, the least recently seen over the cap, and
those of a replica gone are forgotten."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from rest_lsp.team.protocol import CLOSING
from rest_lsp.team.routing import Placements, WorkspaceRouter


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_workspace_stays_and_new_ones_go_to_the_emptiest():
    table = Placements()
    first = {ws: table.place(ws, ["r0", "r1"]) for ws in ("a", "b", "c", "d")}
    assert sorted(Counter(first.values()).values()) == [2, 2]
    assert all(table.place(ws, ["r0", "r1"]) == rid for ws, rid in first.items())
    gone = first["a"]
    left = "r1" if gone == "r0" else "r0"
    assert table.place("a", [left]) == left  # its replica died: it alone moves


def test_a_closed_workspace_counts_no_more_when_new_ones_are_placed():
    """bench_serve's runs one after the other: editors that closed their workspaces still weighed on their
    replica, and the next run's four workspaces went three to one."""
    table = Placements()
    first = {ws: table.place(ws, ["r0", "r1"]) for ws in ("a", "b", "c")}
    heavy = Counter(first.values()).most_common(1)[0][0]
    closing = [ws for ws, rid in first.items() if rid == heavy]
    assert all(table.place(ws + CLOSING, ["r0", "r1"]) == heavy for ws in closing)  # the DELETE goes to its replica
    assert len(table) == 1 and all(ws not in table._placed for ws in closing)
    again = Counter(table.place(ws, ["r0", "r1"]) for ws in ("d", "e", "f"))
    assert sorted(again.values()) == [1, 2]  # four live workspaces, two on each
    assert table.place("zz" + CLOSING, ["r0", "r1"]) in ("r0", "r1") and "zz" not in table._placed  # unknown: anywhere


def test_workspaces_unseen_for_the_idle_time_are_forgotten():
    clock = Clock()
    table = Placements(idle_s=60, clock=clock)
    for i in range(100):
        table.place(f"old{i}", ["r0", "r1"])
    clock.now += 30
    table.place("recent", ["r0", "r1"])
    assert len(table) == 101
    clock.now += 31  # the old ones: 61 s unseen; "recent": 31 s
    table.place("new", ["r0", "r1"])
    assert len(table) == 2
    placed = table.place("recent", ["r0", "r1"])
    assert table.place("recent", ["r0", "r1"]) == placed


def test_the_table_holds_at_most_its_cap_the_least_recently_seen_go_first():
    table = Placements(most=10)
    for i in range(50):
        table.place(f"w{i}", ["r0", "r1"])
        table.place("busy", ["r0", "r1"])  # seen all along: kept
    assert len(table) == 10
    kept = list(table._placed)
    assert "busy" in kept and "w49" in kept and "w0" not in kept


async def test_the_router_forgets_the_workspaces_of_a_replica_gone():
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID

    deployment = DeploymentID(name="rest-lsp", app_name="rest-lsp")
    router = WorkspaceRouter(deployment, DeploymentHandleSource.UNKNOWN)

    async def queue_len(deadline_s):
        return 0

    replicas = [SimpleNamespace(replica_id=ReplicaID(unique_id=f"u{i}", deployment_id=deployment),
                                max_ongoing_requests=8, get_queue_len=queue_len) for i in range(2)]
    router.update_replicas(replicas)

    def request(ws):
        return SimpleNamespace(metadata=SimpleNamespace(session_id=ws, internal_request_id="x"),
                               routing_context=SimpleNamespace(should_backoff=False))

    placed = {ws: (await router.choose_replicas(replicas, request(ws)))[0][0] for ws in ("a", "b", "c", "d")}
    assert sorted(Counter(r.replica_id.unique_id for r in placed.values()).values()) == [2, 2]
    assert len(router._placements) == 4
    router.update_replicas(replicas[1:])  # u0 gone: its workspaces are forgotten
    assert len(router._placements) == 2
    [[again]] = await router.choose_replicas(replicas[1:], request("a"))
    assert again is replicas[1]


def test_the_client_marks_only_its_closing_request():
    """The editor's DELETE at close carries the workspace's session header with CLOSING; every other request the
    workspace's own, so the router keeps routing them by workspace."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from rest_lsp.team.http import Http
    from rest_lsp.team.protocol import WORKSPACE_HEADER

    seen = []

    class Record(BaseHTTPRequestHandler):
        def _answer(self):
            seen.append((self.command, self.headers.get(WORKSPACE_HEADER)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Http(f"http://127.0.0.1:{server.server_port}", "t" * 32, "ws-1")
        client.call("GET", "/v1/workspaces/ws-1/stats")
        client.call("DELETE", "/v1/workspaces/ws-1", closing=True)
        client.call("GET", "/v1/workspaces/ws-1/stats")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("GET", "ws-1"), ("DELETE", "ws-1" + CLOSING), ("GET", "ws-1")]
