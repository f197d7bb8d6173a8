"""Built-in workloads that `mallard demo` and the tests run."""
