"""Benchmarks for natsjs, measured side by side against the reference nats-server.

- ``bench.run``       end-to-end runner: both servers under the same natsbench load, a ratio
                      table on stdout and a trace folder under ``results/``.
- ``bench.scenarios`` the scenario catalogue (data in ``scenarios.toml``).
- ``bench.servers``   starting and stopping server topologies (single node, clusters).
- ``bench.trace``     the one trace schema (Parquet via pyarrow): writer and reader.
- ``bench.analyze``   the PySpark job over many trace folders, with a Markdown/HTML report.
- ``bench.profile``   py-spy flamegraphs of natsjs-server under load.
- ``bench/bench_*.py`` pytest-benchmark micro-benchmarks of ``natsjs._core``.

See ``bench/README.md`` for the commands and ``bench/SCHEMA.md`` for the trace layout.
"""
