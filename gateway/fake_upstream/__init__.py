"""A fake model provider on a real socket: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages.

For trying an agent offline (`gateway fake-upstream`, agent mode: gateway/fake_upstream/agent.py) and for
the test suite, which scripts its answers step by step (gateway/fake_upstream/state.py) and reads back every
request it was sent. It imports nothing of the gateway: it stands in for the providers the gateway calls.
"""
