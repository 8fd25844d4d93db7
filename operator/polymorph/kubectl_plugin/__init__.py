"""``kubectl polymorph``: read and steer ModelDeployments the way ``kubectl argo rollouts`` does.

Commands (``kubectl-polymorph`` on ``PATH`` makes them ``kubectl polymorph ...``); every one names
its object the same way, ``[TYPE] NAME`` or ``TYPE/NAME`` as kubectl does (TYPE ``md``, the
default, or ``cj``):
- ``get [md] NAME [-w]``: a tree of one deployment: the active build, the candidate, the rollout
  step and weight, each analysis value beside its threshold, drift and its reasons, the
  conditions, and its last CompileJob with a leaderboard (baseline and each sandbox's best);
  ``get cj NAME`` shows one CompileJob the same way;
- ``list [md|cj]``: one line per object;
- ``approve``, ``abort``, ``retry``, ``pin``, ``unpin``: each is the annotation or spec change
  the operator already honours (``polymorph.dev/approve``, ``polymorph.dev/abort``,
  ``spec.build.pinned``, or a new CompileJob from a failed one's spec), printed before it is
  applied (``--dry-run``: printed only).

Output: a rich tree on a terminal; plain text when piped (or ``-o text``); ``-o json`` for
scripts. The kubeconfig is ``--kubeconfig``, the first path of ``$KUBECONFIG`` or
``~/.kube/config``, its current context (or ``--context``) and that context's namespace (or
``-n``). The global flags (``-n``, ``--kubeconfig``, ``--context``, ``-o``,
``--request-timeout``) are read wherever they stand, before or after the command. Every name,
type, namespace and context is checked against Kubernetes' rules before any request, and every
request path is built segment by segment (``polymorph.clients.kube.Kind.path``), so no typed
value names another object. Bad input (a flag, an object, a malformed kubeconfig) gets one
sentence naming the flag, argument or file and exit status 2, with no request made; an API
refusal, exit status 1.

Modules: ``view`` (objects into a plain dict), ``render`` (the tree, the text, the table),
``kubeconfig`` (the kubeconfig read and checked, the client made), ``read`` (the session,
``get`` and ``list``), ``change`` (the commands that change something) and ``cli`` (the parser,
the object's shape and ``main``).
"""

from polymorph.kubectl_plugin.cli import main

__all__ = ["main"]
