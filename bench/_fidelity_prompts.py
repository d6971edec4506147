"""The prompts of bench/fidelity.py: 210 single-turn prompts of seven kinds, written out here
(math generated with seeded numbers), so that every run of the benchmark asks the same."""

from __future__ import annotations

import random
from typing import Any

CHAT = [
    "What should I pack for a weekend camping trip in the mountains?",
    "How do I politely decline an invitation to a party?",
    "Can you recommend a good way to start learning to play the guitar?",
    "What is the best way to keep houseplants alive in winter?",
    "I have a job interview tomorrow. Any tips?",
    "Why is the sky blue?",
    "How can I improve my sleep?",
    "What are some fun things to do on a rainy day?",
    "How do I make a good cup of tea?",
    "What is the difference between a virus and a bacterium?",
    "Tell me a joke about computers.",
    "How do airplanes stay in the air?",
    "What is a healthy breakfast I can make in five minutes?",
    "How should I prepare for my first marathon?",
    "Why do cats purr?",
    "What is the capital of Australia, and why is it not Sydney?",
    "Give me advice on saving money as a student.",
    "How do I remove a coffee stain from a white shirt?",
    "What makes a good friend?",
    "Can you explain what inflation is in simple words?",
    "Hi! How are you today?",
    "What is the tallest mountain in the world?",
    "How do bees make honey?",
    "What should I name my new puppy?",
    "Is it better to rent or to buy a home?",
    "Why do leaves change color in autumn?",
    "How does a refrigerator keep food cold?",
    "What is the meaning of the word 'serendipity'?",
    "Who wrote Romeo and Juliet?",
    "Can you help me plan a birthday surprise for my sister?",
]

CODE = [
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    "Write a JavaScript function that returns the largest number in an array.",
    "Write a SQL query that selects all users older than 30 from a table named users.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Explain what this code does: `print(sum(x * x for x in range(10)))`",
    "Write a bash command that counts the lines in every .txt file in a folder.",
    "Write a Python function that returns the Fibonacci numbers up to n.",
    "How do I read a JSON file in Python?",
    "Write a C function that swaps two integers using pointers.",
    "Fix the bug in this Python code: `def add(a, b): return a - b`",
    "Write a Python list comprehension that keeps the even numbers of a list.",
    "Write a regular expression that matches an email address.",
    "Write a Python function that counts the vowels in a sentence.",
    "What is the difference between a list and a tuple in Python?",
    "Write a HTML page with a heading and a button.",
    "Write a Python function that sorts a list of dictionaries by the key 'age'.",
    "Write a Rust function that adds two numbers.",
    "Write a Python script that prints the multiplication table of 7.",
    "How do I create a virtual environment in Python?",
    "Write a Java method that checks whether a string is a palindrome.",
    "Write a Python function that merges two sorted lists.",
    "Explain recursion with a short Python example.",
    "Write a CSS rule that centers a div horizontally.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Go function that returns the sum of a slice of integers.",
    "What does the `git rebase` command do?",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a TypeScript interface for a user with a name, an email and an age.",
    "Write a Python generator that yields the squares of the numbers from 1 to n.",
]

LISTS = [
    "List five fruits that are rich in vitamin C.",
    "List the planets of the solar system in order from the sun.",
    "Give me a numbered list of steps to bake bread.",
    "List seven countries in Africa.",
    "List three advantages and three disadvantages of working from home.",
    "Name ten animals that live in the ocean.",
    "List the days of the week in French.",
    "Give me a bulleted list of things to check before a long car trip.",
    "List five famous painters and one painting by each.",
    "List the first ten prime numbers.",
    "List four ways to reduce plastic waste at home.",
    "Give me a shopping list for a vegetarian lasagna.",
    "List six programming languages and what each is mostly used for.",
    "List the steps to change a flat tire.",
    "Name five musical instruments in an orchestra.",
    "List eight words that rhyme with 'light'.",
    "List the months of the year that have 31 days.",
    "Give me a checklist for moving to a new apartment.",
    "List five exercises you can do without equipment.",
    "List the colors of the rainbow.",
    "List three books every teenager should read, with a reason for each.",
    "List five tips for writing a good email.",
    "Name six capital cities in South America.",
    "List the ingredients of a classic pancake recipe.",
    "List five board games for a family evening.",
    "List the noble gases.",
    "Give me a list of ten common English idioms and their meanings.",
    "List four renewable sources of energy.",
    "List the steps to make a paper airplane.",
    "List five questions to ask at the end of a job interview.",
]

MULTILINGUAL = [
    "Quelle est la capitale de l'Italie ?",
    "Écris un petit poème sur la pluie.",
    "Explique-moi comment faire une omelette.",
    "¿Cuál es el río más largo del mundo?",
    "Escribe una receta sencilla de guacamole.",
    "¿Qué significa la palabra 'ordenador'?",
    "Wie spät ist es, wenn es in Berlin Mittag ist und ich in New York bin?",
    "Erkläre mir, was Photosynthese ist.",
    "Schreibe einen kurzen Brief an einen Freund.",
    "Qual è il piatto più famoso di Napoli?",
    "Quais são as cores da bandeira do Brasil?",
    "Wat is de hoofdstad van Nederland?",
    "Translate into French: 'I would like a coffee, please.'",
    "Translate into Spanish: 'Where is the train station?'",
    "Translate into German: 'The weather is beautiful today.'",
    "Translate into Japanese: 'Thank you very much.'",
    "Translate into Chinese: 'I love reading books.'",
    "Translate into Russian: 'Good night and sweet dreams.'",
    "Translate into English: 'Je suis très content de te voir.'",
    "Translate into English: 'Ich habe Hunger.'",
    "中国的首都是哪里？",
    "请用三句话介绍一下长城。",
    "日本で一番高い山は何ですか？",
    "Как дела? Расскажи о себе.",
    "Что такое искусственный интеллект?",
    "한국의 수도는 어디입니까?",
    "ما هي عاصمة مصر؟",
    "Merhaba! Bugün hava nasıl?",
    "Cześć! Jak się masz?",
    "Xin chào! Bạn có khỏe không?",
]

LONG_FORM = [
    "Write a detailed essay about the history of the printing press.",
    "Write a short story about a robot who learns to paint.",
    "Explain in detail how the internet works, from cables to web pages.",
    "Write a long letter to your future self, ten years from now.",
    "Describe a day in the life of a medieval blacksmith.",
    "Write an article about the benefits and risks of social media for teenagers.",
    "Explain the water cycle in detail for a school report.",
    "Write a story that begins with: 'The door had been locked for a hundred years.'",
    "Write a detailed guide to starting a small vegetable garden.",
    "Describe the causes and effects of climate change.",
    "Write a speech for a graduation ceremony.",
    "Explain how vaccines train the immune system, step by step.",
    "Write a travel blog post about a week in Japan.",
    "Write a fairy tale about a dragon who is afraid of fire.",
    "Explain the theory of evolution to a high-school student.",
    "Write a product description for a smart water bottle, at least three paragraphs.",
    "Describe how a bill becomes a law in a parliamentary democracy.",
    "Write a detailed review of an imaginary restaurant.",
    "Write a story about two friends lost in a forest at night.",
    "Explain the basics of machine learning, with examples.",
    "Write an essay on why reading fiction matters.",
    "Describe the life cycle of a star, from nebula to its end.",
    "Write a motivational blog post about learning from failure.",
    "Explain how a car engine works.",
    "Write a science-fiction story set on a space station near Jupiter.",
    "Write a history of the Olympic Games in several paragraphs.",
    "Explain the causes of the First World War.",
    "Write a detailed plan for a two-week trip across Europe by train.",
    "Describe the ecosystem of a coral reef.",
    "Write a mystery story in which a cat solves the case.",
]

STRUCTURED = [
    "Return a JSON object describing a book with the keys title, author and year.",
    "Write a markdown table of three countries with their capitals and populations.",
    "Give me a YAML config for a web server with a host, a port and a log level.",
    "Write a CSV file with five rows of names and ages.",
    "Return a JSON array of three users, each with an id and a name.",
    "Write a markdown checklist for a software release.",
    "Format this as JSON: name Alice, age 30, city Paris.",
    "Write an XML document describing a library with two books.",
    "Give me a markdown table comparing cats and dogs as pets.",
    "Write a JSON schema for a product with a name and a price.",
    "Write a TOML file for a Python project named demo.",
    "Return the days of the week as a JSON list.",
    "Write a markdown document with a title, two sections and a code block.",
    "Write a weekly meal plan as a markdown table.",
    "Give me a JSON object with the keys 'status' and 'message' for a successful request.",
    "Write a .gitignore file for a Python project.",
    "Write a Dockerfile for a small Python web application.",
    "Write a package.json for a Node.js project named hello.",
    "Write a table in markdown of the first five elements of the periodic table.",
    "Give me an INI file with a database section.",
    "Write a JSON object for a calendar event with a title, a start time and attendees.",
    "Write a markdown list of links to three imaginary documentation pages.",
    "Write a SQL CREATE TABLE statement for a table of orders.",
    "Return a JSON object mapping three colors to their hex codes.",
    "Write a GitHub Actions workflow that runs pytest.",
    "Write a Makefile with build and clean targets.",
    "Write a markdown table of four programming languages and the year each appeared.",
    "Give me a JSON list of three cities with their latitude and longitude.",
    "Write a simple HTML table with two columns: item and price.",
    "Write a README.md for a command-line tool called notes.",
]


def math_prompts(n: int = 30, seed: int = 7) -> list[str]:
    """Arithmetic, word problems and algebra with seeded numbers."""
    rng = random.Random(seed)
    templates = [
        lambda a, b, c: f"What is {a} + {b}?",
        lambda a, b, c: f"What is {a} times {b}?",
        lambda a, b, c: f"Calculate {a * c} divided by {c}.",
        lambda a, b, c: f"Solve for x: {c}x + {a} = {a + c * b}.",
        lambda a, b, c: (f"A shop sells apples at {c} dollars each. How much do {b} apples "
                         "cost?"),
        lambda a, b, c: f"What is {c}% of {a * 10}?",
        lambda a, b, c: (f"A train travels {a * 2} km in {c} hours. What is its average "
                         "speed?"),
        lambda a, b, c: f"What is the square root of {c * c}?",
        lambda a, b, c: f"Is {a} an even or an odd number? Explain.",
        lambda a, b, c: (f"I had {a} marbles and gave away {b}. How many do I have left?"),
        lambda a, b, c: f"What is {b} squared minus {c}?",
        lambda a, b, c: (f"A rectangle is {b} cm long and {c} cm wide. What is its area "
                         "and perimeter?"),
        lambda a, b, c: f"Convert {a} minutes into hours and minutes.",
        lambda a, b, c: f"What is the greatest common divisor of {b * c} and {c * 6}?",
        lambda a, b, c: f"Round {a}.{b} to the nearest whole number.",
    ]
    out = []
    for i in range(n):
        a, b, c = rng.randint(100, 999), rng.randint(2, 60), rng.randint(2, 12)
        out.append(templates[i % len(templates)](a, b, c))
    return out


def builtin_prompts() -> list[dict[str, Any]]:
    """210 single-turn prompts of seven kinds, IDs KIND-NN."""
    kinds = {
        "chat": CHAT, "code": CODE, "math": math_prompts(), "lists": LISTS,
        "multilingual": MULTILINGUAL, "longform": LONG_FORM, "structured": STRUCTURED,
    }
    rows = []
    for kind, texts in kinds.items():
        assert len(set(texts)) == len(texts), kind
        for i, text in enumerate(texts, 1):
            rows.append({"id": f"{kind}-{i:02d}",
                         "messages": [{"role": "user", "content": text}]})
    return rows
