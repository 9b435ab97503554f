"""Fleet evidence: a month of a production training trace simulated under several policies
(`simulate_run`), and a self-contained report of the figures (`write_report`).

trace: the trace file; workload: a session-level workload (NotebookOS's JSON); sessions: the
session model over either; costs: every measured or modelled input; fleet: hosts, gang leases,
autoscaling; policies: reservation (and its idle-reclaimed variants), NotebookOS, fresh, llfabric;
simulate: the event loop; results: figures of an outcome; run: a resumable run directory;
report: the HTML page and its JSON.
"""

from .costs import INPUTS, Costs
from .policies import NAMES
from .report import headline_table, write_report
from .run import simulate_run
from .sessions import SessionModel
from .trace import read_trace

__all__ = ["INPUTS", "NAMES", "Costs", "SessionModel", "headline_table", "read_trace",
           "simulate_run", "write_report"]
