"""Worker apps for the fault-point tests (``-A fault_apps.<service>``): each service's real job body,
lifecycle, database writes and queue, on a fast stand-in for the part that is slow and beside the point
(the sandbox's verdicts, a model's sampling, module validation, a training round)."""
