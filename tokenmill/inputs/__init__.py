"""What comes in: prompts (text or token ids) and chat conversations, turned into token ids
and checked, the same way by the server, the router and the offline API."""
