"""Test support, shared by the tests and the benchmarks (never shipped; nothing under gateway/ imports it).

- `fake_upstream`: the fake provider (gateway/fake_upstream/) in a thread, scripted step by step;
- `gateway`: a gateway on a real socket, its settings and keys, the shared traces;
- `listeners`: loopback listeners that record what reaches them; `tcp_proxy`: a cuttable TCP proxy.
"""
