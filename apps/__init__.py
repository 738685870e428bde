"""The applications: what people run on top of the core.

The `ki` command (`cli`), the native local stack (`stack`), the demo (`demo`), `ki eval` (`eval`),
benchmarks (`bench`), and the sync worker as a child process (`worker_process`). May import every core
package; no core package imports this one (checked by import-linter).
"""
