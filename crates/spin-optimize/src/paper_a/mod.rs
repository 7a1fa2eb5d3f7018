//! Paper A: joint draft-length control and OFDMA uplink bandwidth allocation (filled in by the paper-A work).
