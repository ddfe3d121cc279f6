"""Links and what they cost: the one cost type, link profiles (validated JSON), the
affine fit and the calibration of a real link."""
