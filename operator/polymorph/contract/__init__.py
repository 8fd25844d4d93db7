"""The contract both sides stand on: what the operator and the engine share, and nothing else.

The operator side (``polymorph.core``, ``handlers``, ``clients``, ``compile``, ``kubectl_plugin``)
and the engine (``polymorph_engine``) both import from here; this package imports from neither
(import-linter holds both rules, see ``pyproject.toml``). It holds:

- ``api``: the CRD models (ModelDeployment, CompileJob), their rules, and the records a build
  and an experiment leave (build manifests, experiment records);
- ``validate``: manifests judged as the API server's CEL rules judge them, in one sentence each;
- ``store``: the content-addressed artifact store (local directory or S3) and its key layout;
- ``builds``: build directories, their knobs and variants; ``workload``: traffic profiles and
  traces;
- ``stats``: the paired statistics every verdict is made with; ``measurement``: the benchmark
  protocol's settings;
- ``documents``, ``runner``, ``job``: the compile loop's documents in the store, the runner an
  engine sandbox serves, and the sandbox job's spec;
- ``errors``, ``inputs``, ``yaml_input``: the error types behind every one-sentence message, and
  bounded reading of files and YAML.
"""
