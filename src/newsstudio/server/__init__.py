"""The live service behind `newsstudio serve`: HTTP API, WebSocket and WebRTC sessions, web page.

Entry point: `newsstudio.server.app.create_app(ServerConfig(...))`. Live-session logic lives in
`newsstudio.live` (independent of HTTP); this package only moves its frames and samples.
"""
