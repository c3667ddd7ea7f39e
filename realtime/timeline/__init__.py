"""The timeline: everything the streams reported (captions, descriptions, alerts, tracks, clips),
indexed for search as it lands in JetStream."""
