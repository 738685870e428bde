"""What production runs besides the core: child processes, the supervisor, the API's and the sync worker's
process sets, progress lines, the MCP server. It never imports `apps.dev`.
"""
