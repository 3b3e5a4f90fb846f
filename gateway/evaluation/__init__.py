"""Evaluation: whether the projection changes what the agents do.

`arms.py` puts each conversation in an arm (projected, or held out and forwarded as sent), `signals.py`
reads a run's outcome signals from its transcript and answer, `next_action.py` compares two next
actions, `statistics.py` gives intervals and verdicts, `report.py` reads the signals per arm from the
store, `shadows.py` sends a share of projected requests again unprojected after the client has its
answer.
"""
