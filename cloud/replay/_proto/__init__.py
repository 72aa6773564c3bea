"""Generated gRPC code of the replay service; regenerate with scripts/gen_replay_proto.sh, never edit."""
