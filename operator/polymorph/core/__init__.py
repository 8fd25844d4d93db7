"""The operator's pure logic: functions from plain data (specs, status, observations) to plain data.

Owns: hardware profiles, manifest rendering (``resources``), traffic drift (``drift``), the
rollout state machine (``rollout``), analysis verdicts (``analysis``), PromQL query builders
and result parsing (``promql``), CompileJob planning and status (``compilejobs``) and status
conditions (``conditions``).

It must not know about I/O: no kopf, kubernetes, Prometheus client, HTTP, files or clocks
(the time is always passed in). The handlers gather inputs, call these functions and apply
what they return; an import-linter contract keeps this package free of those imports.
"""
