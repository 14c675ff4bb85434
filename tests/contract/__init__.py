"""The ChangeSource contract suite, run against every source's harness."""
