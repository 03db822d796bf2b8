"""The SLA loop, MOM's for one host: each interval collect, evaluate the policy, apply
its controls, report.

- ``loop``: ``Agent`` runs the cycles and says what each saw and did (``CycleReport``).
- ``policy_watch``: the policy directory, reloaded when its files change.
- ``collectors`` and ``controllers``: one concern a module, found by entry point
  (``plugins``).
- ``journal``: every control applied, recorded as soon as its call succeeded.
- ``reporting``: the host's usage sent to the API; ``narration``: the cycles told in
  the agent's log.
- ``simulated``: an agent on the simulator, as the demos, benchmarks and tests run it.
"""

from loadmaster.agent.sla.journal import AppliedJournal, JournalError, read_journal
from loadmaster.agent.sla.loop import Agent, CycleReport

__all__ = ["Agent", "AppliedJournal", "CycleReport", "JournalError", "read_journal"]
