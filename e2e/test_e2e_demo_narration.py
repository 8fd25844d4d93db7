"""What ``make demo-fleet`` prints (issue 17): each decision once, and a TOK/S column named for what it is.

``narrate`` is the demo's Event narration; each case is a sequence of Events as the API server
lists them (in batches, as successive polls see them) and the lines a person must see.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness import REPO
from scenario import narrate
from support import yamls


def event(rv: int, reason: str, kind: str, name: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": f"u{rv}", "resourceVersion": str(rv)},
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": kind, "name": name},
    }


DONE = "best sha256:ab 1.30x; 3 passed"
MD, CJ = ("ModelDeployment", "chat"), ("CompileJob", "chat-1a2b")
ON_MD = f"CompileJob chat-1a2b: {DONE}"
"""What the operator writes on the deployment for the CompileJob's decision (handlers.compilejobs)."""


@pytest.mark.parametrize(
    ("polls", "told"),
    [
        pytest.param(  # the case: one decision recorded on the cj and on the md
            [[event(1, "CompileJobSucceeded", *CJ, DONE), event(2, "CompileJobSucceeded", *MD, ON_MD)]],
            [("CompileJobSucceeded", "cj/chat-1a2b")],
            id="mirrored-in-one-poll",
        ),
        pytest.param(  # the mirror arrives one poll later
            [[event(1, "CompileJobSucceeded", *CJ, DONE)], [event(2, "CompileJobSucceeded", *MD, ON_MD)]],
            [("CompileJobSucceeded", "cj/chat-1a2b")],
            id="mirrored-across-polls",
        ),
        pytest.param(  # the deployment's copy listed first
            [
                [
                    event(2, "CompileJobFailed", *MD, "CompileJob chat-1a2b: NoBaseline"),
                    event(3, "CompileJobFailed", *CJ, "NoBaseline"),
                ]
            ],
            [("CompileJobFailed", "md/chat")],
            id="mirror-md-first",
        ),
        pytest.param(  # the same words about another CompileJob are another decision
            [
                [
                    event(1, "CompileJobSucceeded", *CJ, DONE),
                    event(2, "CompileJobSucceeded", *MD, f"CompileJob other-9: {DONE}"),
                ]
            ],
            [("CompileJobSucceeded", "cj/chat-1a2b"), ("CompileJobSucceeded", "md/chat")],
            id="another-compilejob",
        ),
        pytest.param(  # listed out of order: told in the order recorded
            [[event(5, "Promoted", *MD, "done"), event(4, "Promoting", *MD, "all steps passed")]],
            [("Promoting", "md/chat"), ("Promoted", "md/chat")],
            id="recorded-order",
        ),
        pytest.param(  # the same step in a second rollout is a new decision, told again
            [[event(1, "CanaryStep", *MD, "step 1/2, 25%")], [event(9, "CanaryStep", *MD, "step 1/2, 25%")]],
            [("CanaryStep", "md/chat"), ("CanaryStep", "md/chat")],
            id="repeat-on-the-same-object",
        ),
        pytest.param(  # two CompileJobs failing for different reasons are two lines
            [
                [
                    event(1, "CompileJobFailed", "CompileJob", "a", "NoBaseline"),
                    event(2, "CompileJobFailed", "CompileJob", "b", "DeadlineExceeded"),
                ]
            ],
            [("CompileJobFailed", "cj/a"), ("CompileJobFailed", "cj/b")],
            id="different-messages",
        ),
    ],
)
def test_each_decision_is_told_once(polls: list[list[dict[str, Any]]], told: list[tuple[str, str]]) -> None:
    memory: dict[tuple[str, str, str], set[str]] = {}
    lines = [line for batch in polls for line in narrate(batch, memory)]
    assert [tuple(line.split()[1:3]) for line in lines] == told


def test_the_build_throughput_column_says_it_is_the_benchmark() -> None:
    crd = yamls.load((REPO / "crds" / "polymorph.dev_modeldeployments.yaml").read_text())
    columns = {c["name"]: c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert "Tok/s" not in columns
    column = columns["Bench-Tok/s"]
    assert column["jsonPath"] == ".status.activeBuild.tokensPerSecond"
    assert "benchmarked" in column["description"] and "not live traffic" in column["description"]
