"""`draftgen audit`: every answer's tokens checked against the run's model format, and
`--quarantine` to move failing answers out so that the next run regenerates them."""

from draftgen.audit.checks import PROBLEMS, TokenSpec, spec_for
from draftgen.audit.report import AuditReport, render_report
from draftgen.audit.run import AuditError, audit_run

__all__ = ["PROBLEMS", "AuditError", "AuditReport", "TokenSpec", "audit_run", "render_report",
           "spec_for"]
