"""NewsStudio: avatar + speech -> lip-synced talking-head video, as clips and as streams."""
__version__ = "0.1.0"
