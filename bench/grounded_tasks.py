"""Chat tasks whose answer copies its input (document-grounded), and one whose answer does not.

Speculative decoding by prompt lookup (engine/speculative/) pays where the answer repeats the
prompt: correcting a passage's spelling, extracting its sentences, editing a function. The
free-form task is the control. bench/speculative.py runs them offline, bench/peers.py served.
"""

PASSAGE = (
    "The lighthouse on Gull Rock was bilt in 1871 by a crew of twelve men who sailed out from the harbour "
    "every morning when the wether allowed. They carried stone, timber and iron in a small boat, and on "
    "calm days they could land three loads before the tide turned. The keeper who came after them, "
    "Thomas Avery, wrote in his log that the lamp had to be cleened twice a day, because the salt spray "
    "left a film on the glass that dimmed the light. In the winter of 1883 a storm broke two of the "
    "lower windows and the keeper spent the night holding a sheet of canvas agianst the gap while his "
    "wife kept the lamp burning. Ships that passed the rock that night never knew how close the light "
    "came to going out. The next spring the harbour board sent new glass and a carpenter, and the "
    "windows were made smaller and stronger. Avery kept the light for thirty-one years. His daughter "
    "Margaret took over after him and was the first woman to keep a light on this part of the coast. "
    "She recorded every ship that passed, the wind, the state of the sea and the hours the lamp burned, "
    "and her logs are now kept in the town libary. In 1932 the light was electrified and the keepers "
    "were no longer needed every night. The last keeper left in 1961, and today the lighthouse is run "
    "by the coast guard from the mainland. Visitors can take a boat to the rock in summer, climb the "
    "ninety-six steps to the lamp room and look out over the same water that Thomas and Margaret "
    "watched for so many years. The old log books, the brass lamp and a model of the first boat are on "
    "display in the museum beside the harbour, wich is open every day exept Monday.")

FUNCTION = '''def summarize_orders(orders, min_total):
    result = []
    for order in orders:
        total = 0
        for item in order["items"]:
            total += item["price"] * item["quantity"]
        if total >= min_total:
            result.append({"id": order["id"], "total": total, "customer": order["customer"]})
    result.sort(key=lambda entry: entry["total"], reverse=True)
    return result
'''

TASKS = {
    "spelling": f"Correct the spelling mistakes in this passage. Reply with the corrected passage only.\n\n{PASSAGE}",
    "extract": f"Copy every sentence of this passage that mentions the keeper, word for word, one per line.\n\n{PASSAGE}",
    "edit": f"Rename the variable `result` to `selected` in this Python function. Reply with the whole function.\n\n{FUNCTION}",
    "free-form": "Write a short story about a fox who learns to play the violin.",
}
