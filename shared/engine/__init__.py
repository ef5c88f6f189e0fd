"""The agent loop, one step at a time: model call, tool dispatch, stop conditions, commits."""
