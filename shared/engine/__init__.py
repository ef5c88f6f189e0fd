"""The agent loop, one step at a time: model call, tool dispatch, stop conditions, commits.

Internal: import the public names from `stepq`; what is in here may change without notice.
"""
