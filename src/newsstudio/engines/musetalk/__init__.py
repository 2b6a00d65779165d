"""engines/musetalk"""
