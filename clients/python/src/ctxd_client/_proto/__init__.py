"""Stubs generated from proto/ctxd/v1/ctxd.proto by ../../generate.sh: do not edit by hand."""
