//! Paper B: uplink or downlink correction, downlink power and proactive draft control (filled in by the paper-B work).
