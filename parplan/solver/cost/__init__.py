"""Cost models: collectives (alpha-beta), compute (roofline), memory."""
