"""Generated gRPC code for strata; regenerate with scripts/gen_proto.sh, never edit."""
